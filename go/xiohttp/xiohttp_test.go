package xiohttp

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"xio.dev/xio"
)

// watchdog bounds waits that would otherwise hang a broken test; no bound
// on speed.
const watchdog = 2 * time.Minute

var testManager *xio.Manager

func TestMain(m *testing.M) {
	if role := os.Getenv("XIO_GO_CHILD"); role != "" {
		os.Exit(childMain(role))
	}
	dir, err := os.MkdirTemp("", "xio-go-http-")
	if err != nil {
		panic(err)
	}
	prefix := fmt.Sprintf("gohttp-%d", os.Getpid())
	os.Setenv("XIO_RUN_DIR", dir)
	os.Setenv("XIO_PREFIX", prefix)
	if os.Getenv("XIO_CONTROL_TIMEOUT_MS") == "" {
		os.Setenv("XIO_CONTROL_TIMEOUT_MS", "60000")
	}
	testManager, err = xio.StartManager(prefix)
	if err != nil {
		panic(err)
	}
	code := m.Run()
	testManager.Stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

// childMain is this test binary run as a child process: "server" serves
// the test app on X-IO at $XIO_GO_ADDR (HTTP/1.1 and h2c) and says
// "ready" on stdout.
func childMain(role string) int {
	switch role {
	case "server":
		l, err := xio.Listen(os.Getenv("XIO_GO_ADDR"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("ready", l.Addr())
		Serve(l, app())
		return 0
	}
	return 2
}

// app is an ordinary net/http handler, nothing in it about X-IO.
func app() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello over %s", r.Proto)
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	})
	// The SHA-256 of what was uploaded.
	mux.HandleFunc("POST /sum", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
	})
	// A streamed body: n lines, each flushed on its own.
	mux.HandleFunc("GET /stream", func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < 10; i++ {
			fmt.Fprintf(w, "line %d\n", i)
			w.(http.Flusher).Flush()
		}
	})
	// Starts a response, then never ends it (until the process dies).
	mux.HandleFunc("GET /hang", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "started")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	return mux
}

var nextPort atomic.Int32

func addr() string {
	return fmt.Sprintf("10.201.0.1:%d", 20000+nextPort.Add(1))
}

// server serves app() on a fresh X-IO address in this process.
func server(t *testing.T) string {
	t.Helper()
	l, err := xio.Listen(addr())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: Handler(app())}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// clients are the two protocols' clients, by name.
func clients() map[string]*http.Client {
	return map[string]*http.Client{"h1": NewClient(), "h2c": NewH2CClient()}
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Routes, a streamed body, a 10 MiB upload and 256 concurrent requests,
// over HTTP/1.1 and h2c, against net/http's server over X-IO.
func TestHTTPOverXio(t *testing.T) {
	a := server(t)
	for proto, c := range clients() {
		t.Run(proto, func(t *testing.T) {
			want := map[string]string{"h1": "HTTP/1.1", "h2c": "HTTP/2.0"}[proto]
			if got := get(t, c, "http://"+a+"/hello"); got != "hello over "+want {
				t.Fatalf("got %q", got)
			}
			resp, err := c.Get("http://" + a + "/nothing")
			if err != nil || resp.StatusCode != 404 {
				t.Fatalf("unknown route: %v %v", resp, err)
			}
			resp.Body.Close()
			// Streamed: read line by line as it comes.
			resp, err = c.Get("http://" + a + "/stream")
			if err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(resp.Body)
			for i := 0; i < 10; i++ {
				if !sc.Scan() || sc.Text() != fmt.Sprintf("line %d", i) {
					t.Fatalf("line %d: %q %v", i, sc.Text(), sc.Err())
				}
			}
			resp.Body.Close()
			// 10 MiB up, checked by its hash.
			big := make([]byte, 10<<20)
			rand.New(rand.NewSource(1)).Read(big)
			sum := sha256.Sum256(big)
			resp, err = c.Post("http://"+a+"/sum", "application/octet-stream", bytes.NewReader(big))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != fmt.Sprintf("%d %s", len(big), hex.EncodeToString(sum[:])) {
				t.Fatalf("upload: %q", b)
			}
			// 256 requests at once.
			var wg sync.WaitGroup
			errs := make(chan error, 256)
			for i := 0; i < 256; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					body := fmt.Sprintf("request %d", i)
					resp, err := c.Post("http://"+a+"/echo", "text/plain", strings.NewReader(body))
					if err != nil {
						errs <- err
						return
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || string(b) != body {
						errs <- fmt.Errorf("echo %d: %q %v", i, b, err)
					}
				}(i)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// With no X-IO service at the address on this node, the clients dial
// TCP: a service elsewhere (here a TCP-only server) is still reached.
func TestTCPFallback(t *testing.T) {
	ts := httptest.NewUnstartedServer(Handler(app()))
	ts.EnableHTTP2 = false
	ts.Start()
	defer ts.Close()
	for proto, c := range clients() {
		if got := get(t, c, ts.URL+"/hello"); !strings.HasPrefix(got, "hello over") {
			t.Fatalf("%s over the fallback: %q", proto, got)
		}
	}
	// Without the fallback, X-IO's refusal is the error.
	d := &xio.Dialer{}
	_, err := d.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
	if err == nil {
		t.Fatal("dialled X-IO where nobody binds")
	}
}

// A server killed with -9 mid-request: the client's read ends with an
// error (no hang), and every buffer the dead process held comes back to
// the pool.
func TestServerKilledMidRequest(t *testing.T) {
	// What the pool has free with this process's other nets idle: the
	// level to come back to once the killed servers' buffers are
	// reclaimed and this test's own net is closed.
	base := settledFree(t)
	n, err := xio.Attach(os.Getenv("XIO_PREFIX"))
	if err != nil {
		t.Fatal(err)
	}
	d := &xio.Dialer{Net: n}
	cs := map[string]*http.Client{
		"h1":  {Transport: NewTransportWith(d)},
		"h2c": {Transport: NewH2CTransportWith(d)},
	}
	for proto, c := range cs {
		t.Run(proto, func(t *testing.T) {
			a := addr()
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "XIO_GO_CHILD=server", "XIO_GO_ADDR="+a)
			cmd.Stderr = os.Stderr
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready") {
				cmd.Process.Kill()
				t.Fatalf("server: %q %v", line, err)
			}
			resp, err := c.Get("http://" + a + "/hang")
			if err != nil {
				cmd.Process.Kill()
				t.Fatal(err)
			}
			first, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err != nil || first != "started\n" {
				cmd.Process.Kill()
				t.Fatalf("first line %q %v", first, err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := io.ReadAll(resp.Body)
				done <- err
			}()
			cmd.Process.Kill()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("the body of a killed server ended without an error")
				}
				t.Logf("%s: the client's read ended with: %v", proto, err)
			case <-time.After(watchdog):
				t.Fatal("watchdog: the client hangs on a killed server")
			}
			resp.Body.Close()
			c.CloseIdleConnections()
		})
	}
	// The test's net closed, the killed servers' buffers reclaimed:
	// every buffer is back.
	n.Close()
	var st xio.ManagerStats
	end := time.Now().Add(watchdog)
	for {
		st, _ = testManager.Stats()
		if st.BuffersFree >= base {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("watchdog: %d buffers not back (%+v)", base-st.BuffersFree, st)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("pool after the kills: %+v", st)
}

// settledFree is the pool's free buffers once the count stops changing
// (the process's nets idle).
func settledFree(t *testing.T) int {
	t.Helper()
	last, same := -1, 0
	for same < 50 {
		st, err := testManager.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.BuffersFree == last {
			same++
		} else {
			last, same = st.BuffersFree, 0
		}
		time.Sleep(time.Millisecond)
	}
	return last
}
