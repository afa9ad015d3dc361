package xio

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// domainChildEnv marks a run of this test binary as the refused process
// of TestRefusedOutsideTheDomain (TestMain then starts no manager).
const domainChildEnv = "XIO_DOMAIN_CHILD"

// A user outside a pool's security domain is refused with an error that
// names the rule, in Go (errors.Is(err, os.ErrPermission)) and in C
// (XIO_ERR_PERMISSION_DENIED): the xio-manager binary, run by root with
// --allow-gid of a group the user is not in, and this test binary and a C
// program run as that user. Needs root (it makes the user), which CI is.
func TestRefusedOutsideTheDomain(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a user and runs processes as it")
	}
	const user, group = "xiot-outsider", "xiot-team"
	if out, err := exec.Command("groupadd", "-f", group).CombinedOutput(); err != nil {
		t.Fatalf("groupadd: %v\n%s", err, out)
	}
	if exec.Command("id", "-u", user).Run() != nil {
		out, err := exec.Command("useradd", "-M", "-N", "-s", "/usr/sbin/nologin", user).CombinedOutput()
		if err != nil {
			t.Fatalf("useradd: %v\n%s", err, out)
		}
	}
	root, _ := filepath.Abs("..")
	// Everything the user runs or reaches lives here (t.TempDir's
	// directories are private to root).
	dir, err := os.MkdirTemp("", "xio-go-domain-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	copyFile(t, self, filepath.Join(dir, "xio.test"))
	src := filepath.Join(dir, "refused.c")
	if err := os.WriteFile(src, []byte(refusedC), 0o644); err != nil {
		t.Fatal(err)
	}
	cbin := filepath.Join(dir, "refused")
	cc := exec.Command("cc", "-O2", "-o", cbin, src,
		"-I"+filepath.Join(root, "crates/xio-capi/include"),
		filepath.Join(root, "target/release/libxio.a"),
		"-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl")
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("compiling refused.c: %v\n%s", err, out)
	}

	run := filepath.Join(dir, "run")
	mgr := exec.Command(filepath.Join(root, "target/release/xio-manager"),
		"--prefix", "godomain", "--class", "2K:64", "--allow-gid", group)
	mgr.Env = append(os.Environ(), "XIO_RUN_DIR="+run)
	if err := mgr.Start(); err != nil {
		t.Fatalf("xio-manager (cargo build --release -p xio-manager): %v", err)
	}
	defer func() { mgr.Process.Kill(); mgr.Wait() }()
	waitFor(t, "the manager's socket", func() bool {
		_, err := os.Stat(filepath.Join(run, "godomain.sock"))
		return err == nil
	})

	asUser := func(args ...string) string {
		cmd := exec.Command("runuser", append([]string{"-u", user, "--"}, args...)...)
		cmd.Env = append(os.Environ(), "XIO_RUN_DIR="+run, "XIO_PREFIX=godomain", domainChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	goOut := asUser(filepath.Join(dir, "xio.test"), "-test.run", "^TestDomainChild$", "-test.v")
	if !strings.Contains(goOut, "is-permission=true") || !strings.Contains(goOut, "--allow-gid") {
		t.Fatalf("Go, outside the domain:\n%s", goOut)
	}
	cOut := asUser(cbin, "godomain")
	if !strings.Contains(cOut, "XIO_ERR_PERMISSION_DENIED") || !strings.Contains(cOut, "security domain") {
		t.Fatalf("C, outside the domain:\n%s", cOut)
	}
	t.Logf("Go: %s", line(goOut, "err="))
	t.Logf("C: %s", strings.TrimSpace(cOut))
}

// TestDomainChild is the refused Go process of TestRefusedOutsideTheDomain
// (run as another user); skipped otherwise.
func TestDomainChild(t *testing.T) {
	if os.Getenv(domainChildEnv) == "" {
		t.Skip("run by TestRefusedOutsideTheDomain")
	}
	l, err := Listen(addr())
	if err == nil {
		l.Close()
		t.Fatal("a process outside the domain listened")
	}
	fmt.Printf("err=%v is-permission=%v\n", err, errors.Is(err, os.ErrPermission))
}

// refusedC attaches a net to the pool argv[1] names and prints the result
// code's name and the library's message.
const refusedC = `#include <stdio.h>
#include "xio.h"
int main(int argc, char **argv) {
	xio_net *net = NULL;
	xio_result r = xio_net_attach(argc > 1 ? argv[1] : NULL, &net);
	if (r == XIO_ERR_PERMISSION_DENIED)
		printf("XIO_ERR_PERMISSION_DENIED: %s\n", xio_last_error());
	else
		printf("result %d: %s\n", (int)r, xio_last_error());
	return 0;
}
`

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// line is the first line of s that holds sub.
func line(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
