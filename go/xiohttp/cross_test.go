package xiohttp

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"xio.dev/xio"
)

// rustExample builds (if needed) and returns the path of an example of the
// repository's Rust crates: the cross-language tests run real programs.
func rustExample(t *testing.T, pkg, name string) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("cargo", "build", "--release", "-q", "-p", pkg, "--example", name)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cargo build -p %s --example %s (needs cargo on PATH): %v\n%s", pkg, name, err, out)
	}
	dir := os.Getenv("CARGO_TARGET_DIR")
	if dir == "" {
		dir = filepath.Join(root, "target")
	}
	return filepath.Join(dir, "release", "examples", name)
}

// A Go client against the Rust server (axum over xio-tokio, the
// repository's axum example): GET and a JSON POST, over HTTP/1.1.
func TestGoClientRustServer(t *testing.T) {
	bin := rustExample(t, "xio-hyper", "axum")
	// It listens on X-IO 127.0.0.1:3000 of the tests' pool (and on TCP
	// at a port of its choice), until its input ends.
	cmd := exec.Command(bin, "serve", "127.0.0.1:0", "--until-eof")
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
		cmd.Process.Kill()
		t.Fatalf("axum server: %q %v", line, err)
	}
	// Only X-IO: a TCP dial would not reach 127.0.0.1:3000.
	c := &http.Client{Transport: NewTransportWith(&xio.Dialer{})}
	if got := get(t, c, "http://127.0.0.1:3000/hello"); got != "hello from axum" {
		t.Fatalf("GET: %q", got)
	}
	resp, err := c.Post("http://127.0.0.1:3000/order", "application/json", strings.NewReader(`{"item":"tea","qty":3}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var receipt struct {
		Item       string `json:"item"`
		Qty        int    `json:"qty"`
		TotalCents int    `json:"total_cents"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&receipt); err != nil || receipt.TotalCents != 750 {
		t.Fatalf("POST: %+v %v", receipt, err)
	}
	c.CloseIdleConnections()
}

// The Rust client (hyper-util with xio-hyper's connector, the
// repository's fetch example) against the Go server, over HTTP/1.1 and
// h2c.
func TestRustClientGoServer(t *testing.T) {
	bin := rustExample(t, "xio-hyper", "fetch")
	a := server(t)
	for _, h2c := range []bool{false, true} {
		args := []string{"http://" + a + "/hello"}
		want := "HTTP/1.1 200 OK\nhello over HTTP/1.1"
		if h2c {
			args = append([]string{"--h2c"}, args...)
			want = "HTTP/2.0 200 OK\nhello over HTTP/2.0"
		}
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Fatalf("fetch %v: %v\n%s", args, err, out)
		}
		// A POST whose body the Go server echoes.
		out, err = exec.Command(bin, append(args[:len(args)-1], "http://"+a+"/echo", `{"from":"rust"}`)...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), `{"from":"rust"}`) {
			t.Fatalf("fetch POST: %v\n%s", err, out)
		}
	}
}
