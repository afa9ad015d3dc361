package xio

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The C sock_client (crates/xio-capi/examples, a blocking C program on
// xio.h) against a Go echo server: 2,000 round trips of 300 bytes, each
// checked by the client, then its half-close and the server's end of
// stream.
func TestCClientGoServer(t *testing.T) {
	root, _ := filepath.Abs("..")
	bin := filepath.Join(t.TempDir(), "sock_client")
	cc := exec.Command("cc", "-O2", "-o", bin,
		filepath.Join(root, "crates/xio-capi/examples/sock_client.c"),
		"-I"+filepath.Join(root, "crates/xio-capi/include"),
		filepath.Join(root, "target/release/libxio.a"),
		"-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl")
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("compiling sock_client: %v\n%s", err, out)
	}
	l, err := Listen(addr())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	served := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(c, c) // until the client's half-close
		served <- err
	}()
	out, err := exec.Command(bin, os.Getenv("XIO_PREFIX"), l.Addr().String(), "2000", "300").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "XIO:rtt n=2000") {
		t.Fatalf("sock_client: %v\n%s", err, out)
	}
	t.Logf("C sock_client -> Go server: %s", strings.TrimSpace(string(out)))
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}
