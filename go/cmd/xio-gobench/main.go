// Command xio-gobench measures Go programs over X-IO next to the kernel's
// TCP loopback and Unix sockets, in the same run: a raw net.Conn 64 B
// ping-pong, and net/http echo servers (HTTP/1.1 and h2c) driven by
// net/http clients. The client and the server are separate processes,
// each pinned to its own CPU (taskset), one Go P each. xio-bench's `go`
// section runs it; it prints markdown tables.
//
//	xio-gobench pingpong [-iters N] [-size B]
//	xio-gobench http [-conns 1,16,64,256] [-duration 2s] [-protos h1,h2c]
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"xio.dev/xio"
	"xio.dev/xio/xiohttp"
)

var transports = []string{"uds", "tcp", "xio"}

// The CPUs the client and the server are pinned to ($XIO_GOBENCH_CPUS,
// "client,server"; "0,1" by default: apart. "0,0" shares one core).
var clientCPU, serverCPU = cpus()

func cpus() (string, string) {
	c, s, ok := strings.Cut(os.Getenv("XIO_GOBENCH_CPUS"), ",")
	if !ok {
		return "0", "1"
	}
	return c, s
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "pingpong":
		pingpong(os.Args[2:])
	case "http":
		httpBench(os.Args[2:])
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: xio-gobench pingpong|http [flags]  (see the package doc)")
	os.Exit(2)
}

func die(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "xio-gobench: "+f+"\n", a...)
	os.Exit(1)
}

// listen opens the server's listener of a transport at addr.
func listen(transport, addr string) net.Listener {
	var l net.Listener
	var err error
	switch transport {
	case "uds":
		os.Remove(addr)
		l, err = net.Listen("unix", addr)
	case "tcp":
		l, err = net.Listen("tcp", addr)
	case "xio":
		l, err = xio.Listen(addr)
	default:
		die("unknown transport %q", transport)
	}
	if err != nil {
		die("listen %s %s: %v", transport, addr, err)
	}
	return l
}

// dial connects to a server of a transport.
func dial(ctx context.Context, transport, addr string) (net.Conn, error) {
	switch transport {
	case "uds":
		var d net.Dialer
		return d.DialContext(ctx, "unix", addr)
	case "tcp":
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.(*net.TCPConn).SetNoDelay(true)
		}
		return c, err
	default:
		return (&xio.Dialer{}).DialContext(ctx, "tcp", addr)
	}
}

// serve is the server process: `serve MODE TRANSPORT ADDR`. It prints
// "ready" once it listens, and serves until its stdin closes.
func serve(args []string) {
	if len(args) != 3 {
		die("serve MODE TRANSPORT ADDR")
	}
	mode, transport, addr := args[0], args[1], args[2]
	if path := os.Getenv("XIO_GOBENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path + "." + transport + ".server")
		if err != nil {
			die("%v", err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	l := listen(transport, addr)
	switch mode {
	case "echo":
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					buf := make([]byte, 64<<10)
					for {
						n, err := c.Read(buf)
						if err != nil {
							return
						}
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
				}()
			}
		}()
	case "http":
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(body)
		})
		go xiohttp.Serve(l, h)
	default:
		die("unknown mode %q", mode)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	l.Close()
}

// server runs the server process pinned to its CPU and waits for "ready".
func server(mode, transport, addr string) (stop func()) {
	self, _ := os.Executable()
	cmd := exec.Command("taskset", "-c", serverCPU, self, "serve", mode, transport, addr)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		die("%v", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		die("%v", err)
	}
	if err := cmd.Start(); err != nil {
		die("start server: %v", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		die("server did not start: %q %v", line, err)
	}
	return func() {
		in.Close()
		cmd.Wait()
	}
}

// addrOf is where a transport's server listens in this run.
func addrOf(transport string, dir string, port int) string {
	switch transport {
	case "uds":
		return filepath.Join(dir, "gobench.sock")
	case "tcp":
		return fmt.Sprintf("127.0.0.1:%d", port)
	default:
		return fmt.Sprintf("10.123.0.1:%d", port)
	}
}

// setup pins this process to its CPU (by running itself again under
// taskset) and starts a manager for the run's X-IO pool.
func setup() (dir string, done func()) {
	if os.Getenv("XIO_GOBENCH_PINNED") == "" {
		self, _ := os.Executable()
		cmd := exec.Command("taskset", append([]string{"-c", clientCPU, self}, os.Args[1:]...)...)
		cmd.Env = append(os.Environ(), "XIO_GOBENCH_PINNED=1", "GOMAXPROCS=1")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			if ee, ok := err.(*exec.ExitError); ok {
				os.Exit(ee.ExitCode())
			}
			die("taskset: %v", err)
		}
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "xio-gobench-")
	if err != nil {
		die("%v", err)
	}
	prefix := fmt.Sprintf("gobench-%d", os.Getpid())
	os.Setenv("XIO_RUN_DIR", dir)
	os.Setenv("XIO_PREFIX", prefix)
	m, err := xio.StartManager(prefix)
	if err != nil {
		die("manager: %v", err)
	}
	return dir, func() {
		m.Stop()
		os.RemoveAll(dir)
	}
}

func pingpong(args []string) {
	fs := flag.NewFlagSet("pingpong", flag.ExitOnError)
	iters := fs.Int("iters", 20000, "timed round trips per transport and round")
	size := fs.Int("size", 64, "message size in bytes")
	rounds := fs.Int("rounds", 3, "rounds, run round-robin over the transports")
	transportsF := fs.String("transports", "uds,tcp,xio", "transports")
	fs.Parse(args)
	transports = strings.Split(*transportsF, ",")
	dir, done := setup()
	defer done()
	samples := map[string][]time.Duration{}
	for r := 0; r < *rounds; r++ {
		for i, t := range transports {
			fmt.Fprintf(os.Stderr, "[xio-gobench] pingpong %s (round %d/%d)\n", t, r+1, *rounds)
			addr := addrOf(t, dir, 19000+10*r+i)
			stop := server("echo", t, addr)
			samples[t] = append(samples[t], pingpongOne(t, addr, *size, *iters)...)
			stop()
		}
	}
	fmt.Printf("| transport | p50 µs | p99 µs | mean µs |\n|---|---:|---:|---:|\n")
	for _, t := range transports {
		s := samples[t]
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		var sum time.Duration
		for _, d := range s {
			sum += d
		}
		fmt.Printf("| %s | %.2f | %.2f | %.2f |\n", name(t), us(s[len(s)/2]), us(s[len(s)*99/100]), us(sum/time.Duration(len(s))))
	}
}

func name(t string) string {
	switch t {
	case "uds":
		return "Unix socket"
	case "tcp":
		return "TCP loopback"
	}
	return "X-IO"
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

func pingpongOne(t, addr string, size, iters int) []time.Duration {
	c, err := dial(context.Background(), t, addr)
	if err != nil {
		die("dial %s: %v", t, err)
	}
	defer c.Close()
	msg := make([]byte, size)
	back := make([]byte, size)
	rt := func() {
		if _, err := c.Write(msg); err != nil {
			die("write: %v", err)
		}
		if _, err := io.ReadFull(c, back); err != nil {
			die("read: %v", err)
		}
	}
	for i := 0; i < iters/10; i++ {
		rt()
	}
	s := make([]time.Duration, iters)
	for i := range s {
		t0 := time.Now()
		rt()
		s[i] = time.Since(t0)
	}
	return s
}

func httpBench(args []string) {
	fs := flag.NewFlagSet("http", flag.ExitOnError)
	connsF := fs.String("conns", "1,16,64,256", "connection counts")
	dur := fs.Duration("duration", 2*time.Second, "measured time per cell (split over the rounds)")
	rounds := fs.Int("rounds", 2, "rounds per cell, round-robin over the transports")
	protosF := fs.String("protos", "h1,h2c", "protocols")
	transportsF := fs.String("transports", "uds,tcp,xio", "transports")
	fs.Parse(args)
	transports = strings.Split(*transportsF, ",")
	var conns []int
	for _, s := range strings.Split(*connsF, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			die("bad -conns %q", *connsF)
		}
		conns = append(conns, n)
	}
	dir, done := setup()
	defer done()
	if path := os.Getenv("XIO_GOBENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path + ".client")
		if err != nil {
			die("%v", err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	for _, proto := range strings.Split(*protosF, ",") {
		reqs := map[string]map[int]int64{}
		lat := map[string]map[int][]time.Duration{}
		for ci, n := range conns {
			for r := 0; r < *rounds; r++ {
				for i, t := range transports {
					fmt.Fprintf(os.Stderr, "[xio-gobench] http %s %s %d conns (round %d/%d)\n", proto, t, n, r+1, *rounds)
					addr := addrOf(t, dir, 20000+100*ci+10*r+i)
					stop := server("http", t, addr)
					k, l := httpOne(proto, t, addr, n, *dur/time.Duration(*rounds))
					stop()
					if reqs[t] == nil {
						reqs[t], lat[t] = map[int]int64{}, map[int][]time.Duration{}
					}
					reqs[t][n] += k
					lat[t][n] = append(lat[t][n], l...)
				}
			}
		}
		fmt.Printf("\n%s, POST 64 B echo, requests/s (p50 µs):\n\n", map[string]string{"h1": "HTTP/1.1", "h2c": "h2c"}[proto])
		fmt.Printf("| conns |")
		for _, t := range transports {
			fmt.Printf(" %s |", name(t))
		}
		fmt.Printf(" X-IO / Unix socket |\n|---:|")
		for range transports {
			fmt.Printf("---:|")
		}
		fmt.Printf("---:|\n")
		for _, n := range conns {
			fmt.Printf("| %d |", n)
			rate := map[string]float64{}
			for _, t := range transports {
				s := lat[t][n]
				sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
				rate[t] = float64(reqs[t][n]) / dur.Seconds()
				p50 := 0.0
				if len(s) > 0 {
					p50 = us(s[len(s)/2])
				}
				fmt.Printf(" %.0f (%.1f) |", rate[t], p50)
			}
			if rate["uds"] > 0 {
				fmt.Printf(" %.2fx |\n", rate["xio"]/rate["uds"])
			} else {
				fmt.Printf(" |\n")
			}
		}
	}
}

// client is an http.Client for a transport and protocol (connection i of
// several for h2c, which multiplexes one connection per transport).
func client(proto, t, addr string) *http.Client {
	d := func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx, t, addr) }
	if proto == "h2c" {
		return &http.Client{Transport: &http2.Transport{
			AllowHTTP: true,
			DialTLSContext: func(ctx context.Context, n, a string, _ *tls.Config) (net.Conn, error) {
				return d(ctx, n, a)
			},
		}}
	}
	return &http.Client{Transport: &http.Transport{DialContext: d, MaxIdleConnsPerHost: 1024}}
}

// httpOne runs n client goroutines, each with one request in flight on a
// keep-alive connection of its own, for d: requests done and latencies.
func httpOne(proto, t, addr string, n int, d time.Duration) (int64, []time.Duration) {
	url := "http://" + addr + "/echo"
	if t == "uds" {
		url = "http://localhost/echo"
	}
	body := bytes.Repeat([]byte("x"), 64)
	var count atomic.Int64
	var stopFlag atomic.Bool
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		c := client(proto, t, addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			one := func() bool {
				resp, err := c.Post(url, "application/octet-stream", bytes.NewReader(body))
				if err != nil {
					die("%s %s: %v", proto, t, err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || len(got) != len(body) {
					die("%s %s: bad response %d %v", proto, t, len(got), err)
				}
				return true
			}
			one() // connect and warm up
			<-start
			var mine []time.Duration
			for !stopFlag.Load() {
				t0 := time.Now()
				one()
				mine = append(mine, time.Since(t0))
			}
			count.Add(int64(len(mine)))
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
			c.CloseIdleConnections()
		}()
	}
	time.Sleep(10 * time.Millisecond)
	close(start)
	time.Sleep(d)
	stopFlag.Store(true)
	wg.Wait()
	return count.Load(), all
}
