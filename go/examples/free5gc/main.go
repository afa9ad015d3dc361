// Command free5gc is the X-IO paper's case study with free5GC's own SBI
// code: an AMF-like client runs 5G-AKA UE authentications through an
// AUSF and a UDM (stand-ins: separate processes serving the 3GPP paths
// with net/http over h2c), the requests and replies made and read by
// free5GC's generated clients and models (github.com/free5gc/openapi).
// The services are the same code over TCP and over X-IO: only the
// http.Client each is given changes (xiohttp.NewH2CClient), and the
// listener. It prints each transport's end-to-end latency per
// authentication, in alternating rounds.
//
//	free5gc [-n 2000] [-rounds 3]
//
// It starts its own X-IO manager, and pins the AMF and the UDM to CPU 0
// and the AUSF to CPU 1 (with taskset, when there is one), so that every
// hop of the chain crosses cores.
package main

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"time"

	ausf "github.com/free5gc/openapi/ausf/UEAuthentication"
	"github.com/free5gc/openapi/models"
	udm "github.com/free5gc/openapi/udm/UEAuthentication"
	"golang.org/x/net/http2"
	"xio.dev/xio"
	"xio.dev/xio/xiohttp"
)

// The SBI addresses of free5GC's default configuration.
const (
	ausfAddr = "127.0.0.9:8000"
	udmAddr  = "127.0.0.3:8000"
	snn      = "5G:mnc093.mcc208.3gppnetwork.org"
)

// asNF serves as the NF $XIO_FREE5GC_ROLE names, if it names one (this
// program runs itself as the AUSF and the UDM), over the transport
// given as the first argument.
func asNF() bool {
	switch os.Getenv("XIO_FREE5GC_ROLE") {
	case "udm":
		serveNF(os.Args[1], udmAddr, udmHandler())
	case "ausf":
		serveNF(os.Args[1], ausfAddr, ausfHandler(os.Args[1]))
	default:
		return false
	}
	return true
}

func main() {
	if asNF() {
		return
	}
	n := flag.Int("n", 2000, "authentications per transport and round")
	rounds := flag.Int("rounds", 3, "rounds, alternating the transports")
	prof := flag.String("cpuprofile", "", "write the AMF's CPU profile here")
	flag.Parse()
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			fmt.Fprintln(os.Stderr, "free5gc:", err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	res, err := run(*n, *rounds, true)
	if err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "free5gc:", err)
		os.Exit(1)
	}
	fmt.Printf("5G-AKA UE authentication, AMF -> AUSF -> UDM over h2c (2 AMF->AUSF and 2 AUSF->UDM requests each), µs:\n\n")
	fmt.Printf("| transport | authentications | p50 | p99 | mean |\n|---|---:|---:|---:|---:|\n")
	for _, t := range []string{"tcp", "xio"} {
		s := res[t]
		fmt.Printf("| %s | %d | %.1f | %.1f | %.1f |\n", map[string]string{"tcp": "TCP loopback", "xio": "X-IO"}[t],
			len(s), us(s[len(s)/2]), us(s[len(s)*99/100]), us(mean(s)))
	}
	fmt.Printf("\nX-IO is %.1fx faster at the median.\n", float64(res["tcp"][len(res["tcp"])/2])/float64(res["xio"][len(res["xio"])/2]))
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

func mean(s []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range s {
		t += d
	}
	return t / time.Duration(len(s))
}

// run starts an X-IO manager and both deployments (TCP and X-IO: an AUSF
// and a UDM process each), then runs n authentications per transport and
// round as the AMF. It returns the sorted latencies by transport.
func run(n, rounds int, pin bool) (map[string][]time.Duration, error) {
	dir, err := os.MkdirTemp("", "xio-free5gc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	prefix := fmt.Sprintf("free5gc-%d", os.Getpid())
	os.Setenv("XIO_RUN_DIR", dir)
	os.Setenv("XIO_PREFIX", prefix)
	m, err := xio.StartManager(prefix)
	if err != nil {
		return nil, err
	}
	defer m.Stop()
	cpu := func(c string) []string {
		if _, err := exec.LookPath("taskset"); pin && err == nil {
			return []string{"taskset", "-c", c}
		}
		return nil
	}
	if pin {
		if err := pinSelf(cpu("0")); err != nil {
			return nil, err
		}
	}
	for _, t := range []string{"tcp", "xio"} {
		for _, role := range []string{"udm", "ausf"} {
			stop, err := startNF(role, t, cpu(map[string]string{"udm": "0", "ausf": "1"}[role]))
			if err != nil {
				return nil, err
			}
			defer stop()
		}
	}
	clients := map[string]*ausf.APIClient{"tcp": ausfClient("tcp"), "xio": ausfClient("xio")}
	res := map[string][]time.Duration{}
	for r := 0; r < rounds; r++ {
		for _, t := range []string{"tcp", "xio"} {
			c := clients[t]
			// Warm-up: connections made, both NFs' too.
			for i := 0; i < n/10+1; i++ {
				if err := authenticate(c, i); err != nil {
					return nil, fmt.Errorf("%s: %w", t, err)
				}
			}
			for i := 0; i < n; i++ {
				t0 := time.Now()
				if err := authenticate(c, i); err != nil {
					return nil, fmt.Errorf("%s: %w", t, err)
				}
				res[t] = append(res[t], time.Since(t0))
			}
		}
	}
	for _, s := range res {
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	}
	return res, nil
}

// pinSelf runs the rest of the program pinned, through taskset on this
// process (threads made later inherit it).
func pinSelf(taskset []string) error {
	if taskset == nil {
		return nil
	}
	return exec.Command("taskset", "-a", "-p", "-c", taskset[2], fmt.Sprint(os.Getpid())).Run()
}

// h2cClient is the http.Client an NF of transport t calls others with:
// the one line that differs between the deployments.
func h2cClient(t string) *http.Client {
	if t == "xio" {
		return xiohttp.NewH2CClient()
	}
	// free5GC's own cleartext HTTP/2 client, as openapi builds it.
	return &http.Client{Transport: &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}}
}

func ausfClient(t string) *ausf.APIClient {
	cfg := ausf.NewConfiguration()
	cfg.SetBasePath("http://" + ausfAddr)
	cfg.SetHTTPClient(h2cClient(t))
	return ausf.NewAPIClient(cfg)
}

// The subscribers' long-term keys (the UE's and the UDM's copy).
func key(supi string) []byte {
	k := sha256.Sum256([]byte("k:" + supi))
	return k[:]
}

func mac(k []byte, parts ...string) []byte {
	h := hmac.New(sha256.New, k)
	for _, p := range parts {
		h.Write([]byte(p))
	}
	return h.Sum(nil)
}

// hxres is HXRES* = the low 128 bits of SHA-256(RAND || XRES*), as TS
// 33.501 Annex A.5 computes it.
func hxres(randHex, xresHex string) string {
	r, _ := hex.DecodeString(randHex)
	x, _ := hex.DecodeString(xresHex)
	s := sha256.Sum256(append(r, x...))
	return hex.EncodeToString(s[16:])
}

// authenticate is the AMF's side of one UE's 5G-AKA: ask the AUSF to
// authenticate, check the challenge as the UE and the SEAF would, and
// confirm with RES*.
func authenticate(c *ausf.APIClient, i int) error {
	supi := fmt.Sprintf("imsi-2089300000%05d", i%100000)
	ctx := context.Background()
	resp, err := c.DefaultApi.UeAuthenticationsPost(ctx, &ausf.UeAuthenticationsPostRequest{
		AuthenticationInfo: &models.AuthenticationInfo{SupiOrSuci: supi, ServingNetworkName: snn},
	})
	if err != nil {
		return fmt.Errorf("ue-authentications: %w", err)
	}
	ue := resp.UeAuthenticationCtx
	b, _ := json.Marshal(ue.Var5gAuthData)
	var av models.Av5gAka
	if err := json.Unmarshal(b, &av); err != nil {
		return err
	}
	// The UE's RES*, from its own key; the SEAF's check of HXRES*.
	res := hex.EncodeToString(mac(key(supi), "res", av.Rand, snn)[:16])
	if hxres(av.Rand, res) != av.HxresStar {
		return fmt.Errorf("HXRES* mismatch for %s", supi)
	}
	link := ue.Links["5g-aka"]
	if len(link) == 0 {
		return fmt.Errorf("no 5g-aka link")
	}
	id := link[0].Href[strings.LastIndex(strings.TrimSuffix(link[0].Href, "/5g-aka-confirmation"), "/")+1:]
	id = strings.TrimSuffix(id, "/5g-aka-confirmation")
	conf, err := c.DefaultApi.UeAuthenticationsAuthCtxId5gAkaConfirmationPut(ctx, &ausf.UeAuthenticationsAuthCtxId5gAkaConfirmationPutRequest{
		AuthCtxId:        &id,
		ConfirmationData: &models.ConfirmationData{ResStar: res},
	})
	if err != nil {
		return fmt.Errorf("5g-aka-confirmation: %w", err)
	}
	if conf.ConfirmationDataResponse.AuthResult != models.AusfUeAuthenticationAuthResult_SUCCESS || conf.ConfirmationDataResponse.Supi != supi {
		return fmt.Errorf("authentication of %s: %+v", supi, conf.ConfirmationDataResponse)
	}
	return nil
}

// startNF runs this program as NF role for transport t and waits until it
// serves.
func startNF(role, t string, taskset []string) (func(), error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := append(append([]string{}, taskset...), self, t)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "XIO_FREE5GC_ROLE="+role, "GOMAXPROCS=1")
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		cmd.Process.Kill()
		return nil, fmt.Errorf("%s over %s did not start: %q %v", role, t, line, err)
	}
	return func() { in.Close(); cmd.Wait() }, nil
}

// serveNF serves h at addr over transport t (h2c and HTTP/1.1), says
// "ready", and stops when its input ends.
func serveNF(t, addr string, h http.Handler) {
	var l net.Listener
	var err error
	if t == "xio" {
		l, err = xio.Listen(addr)
	} else {
		l, err = net.Listen("tcp", addr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go xiohttp.Serve(l, h)
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func problem(w http.ResponseWriter, status int, cause string) {
	writeJSON(w, status, models.ProblemDetails{Status: int32(status), Cause: cause})
}

// udmHandler serves Nudm_UEAuthentication's generate-auth-data and
// auth-events.
func udmHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /nudm-ueau/v1/{supi}/security-information/generate-auth-data", func(w http.ResponseWriter, r *http.Request) {
		var req models.UdmUeauAuthenticationInfoRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ServingNetworkName == "" {
			problem(w, 400, "MANDATORY_IE_MISSING")
			return
		}
		supi := r.PathValue("supi")
		k := key(supi)
		rnd := make([]byte, 16)
		rand.Read(rnd)
		randHex := hex.EncodeToString(rnd)
		writeJSON(w, 200, models.UdmUeauAuthenticationInfoResult{
			AuthType: models.UdmUeauAuthType__5_G_AKA,
			Supi:     supi,
			AuthenticationVector: &models.AuthenticationVector{
				AvType:   models.AvType__5_G_HE_AKA,
				Rand:     randHex,
				Autn:     hex.EncodeToString(mac(k, "autn", randHex)[:16]),
				XresStar: hex.EncodeToString(mac(k, "res", randHex, req.ServingNetworkName)[:16]),
				Kausf:    hex.EncodeToString(mac(k, "kausf", randHex)),
			},
		})
	})
	mux.HandleFunc("POST /nudm-ueau/v1/{supi}/auth-events", func(w http.ResponseWriter, r *http.Request) {
		var ev models.AuthEvent
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil || !ev.Success {
			problem(w, 400, "INVALID_AUTH_EVENT")
			return
		}
		w.Header().Set("Location", "/nudm-ueau/v1/"+r.PathValue("supi")+"/auth-events/1")
		writeJSON(w, 201, ev)
	})
	return mux
}

// ausfHandler serves Nausf_UEAuthentication's ue-authentications and
// 5g-aka-confirmation, calling the UDM with free5GC's UDM client over
// transport t.
func ausfHandler(t string) http.Handler {
	cfg := udm.NewConfiguration()
	cfg.SetBasePath("http://" + udmAddr)
	cfg.SetHTTPClient(h2cClient(t))
	udmc := udm.NewAPIClient(cfg)
	type authCtx struct{ supi, xres, kausf, snn string }
	var mu sync.Mutex
	ctxs := map[string]authCtx{}
	var next int
	mux := http.NewServeMux()
	mux.HandleFunc("POST /nausf-auth/v1/ue-authentications", func(w http.ResponseWriter, r *http.Request) {
		var info models.AuthenticationInfo
		if err := json.NewDecoder(r.Body).Decode(&info); err != nil || info.SupiOrSuci == "" {
			problem(w, 400, "MANDATORY_IE_MISSING")
			return
		}
		res, err := udmc.GenerateAuthDataApi.GenerateAuthData(r.Context(), &udm.GenerateAuthDataRequest{
			SupiOrSuci: &info.SupiOrSuci,
			UdmUeauAuthenticationInfoRequest: &models.UdmUeauAuthenticationInfoRequest{
				ServingNetworkName: info.ServingNetworkName,
				AusfInstanceId:     "ausf-1",
			},
		})
		if err != nil {
			problem(w, 504, "UPSTREAM_SERVER_ERROR")
			return
		}
		av := res.UdmUeauAuthenticationInfoResult.AuthenticationVector
		mu.Lock()
		next++
		id := fmt.Sprint(next)
		ctxs[id] = authCtx{res.UdmUeauAuthenticationInfoResult.Supi, av.XresStar, av.Kausf, info.ServingNetworkName}
		mu.Unlock()
		href := "http://" + ausfAddr + "/nausf-auth/v1/ue-authentications/" + id + "/5g-aka-confirmation"
		w.Header().Set("Location", "http://"+ausfAddr+"/nausf-auth/v1/ue-authentications/"+id)
		writeJSON(w, 201, models.UeAuthenticationCtx{
			AuthType:           models.AusfUeAuthenticationAuthType__5_G_AKA,
			Var5gAuthData:      models.Av5gAka{Rand: av.Rand, Autn: av.Autn, HxresStar: hxres(av.Rand, av.XresStar)},
			Links:              map[string][]models.Link{"5g-aka": {{Href: href}}},
			ServingNetworkName: info.ServingNetworkName,
		})
	})
	mux.HandleFunc("PUT /nausf-auth/v1/ue-authentications/{id}/5g-aka-confirmation", func(w http.ResponseWriter, r *http.Request) {
		var cd models.ConfirmationData
		if err := json.NewDecoder(r.Body).Decode(&cd); err != nil {
			problem(w, 400, "MANDATORY_IE_MISSING")
			return
		}
		mu.Lock()
		ac, ok := ctxs[r.PathValue("id")]
		delete(ctxs, r.PathValue("id"))
		mu.Unlock()
		if !ok {
			problem(w, 404, "CONTEXT_NOT_FOUND")
			return
		}
		if cd.ResStar != ac.xres {
			writeJSON(w, 200, models.ConfirmationDataResponse{AuthResult: models.AusfUeAuthenticationAuthResult_FAILURE})
			return
		}
		now := time.Now()
		if _, err := udmc.ConfirmAuthApi.ConfirmAuth(r.Context(), &udm.ConfirmAuthRequest{
			Supi: &ac.supi,
			AuthEvent: &models.AuthEvent{NfInstanceId: "ausf-1", Success: true, TimeStamp: &now,
				AuthType: models.UdmUeauAuthType__5_G_AKA, ServingNetworkName: ac.snn},
		}); err != nil {
			problem(w, 504, "UPSTREAM_SERVER_ERROR")
			return
		}
		kausf, _ := hex.DecodeString(ac.kausf)
		writeJSON(w, 200, models.ConfirmationDataResponse{
			AuthResult: models.AusfUeAuthenticationAuthResult_SUCCESS,
			Supi:       ac.supi,
			Kseaf:      hex.EncodeToString(mac(kausf, "kseaf", ac.snn)),
		})
	})
	return mux
}
