// Command testserver is the workload of the test clusters' pods. It answers
// on two ports:
//
//   - TCP (-tcp, default :9000): reads one line, answers one line with the
//     address it sees the client as, its host (pod) name and its pod's
//     UID (when $POD_UID is set), the protocol of harness.Netns.ServeTCP
//     with the UID added;
//   - HTTP (-http, default :8080): /hostname answers the host (pod) name,
//     /peer the client's address as seen here, /bytes?n=N N bytes (for
//     bulk transfers), / both and the pod's UID (from $POD_UID, which
//     the downward API sets): names and addresses repeat across
//     clusters, a UID does not.
//
// It logs every connection to stdout, so `kubectl logs` has something to
// show. With -get URL it is a client instead: it prints the body of one GET
// and exits (non-zero on failure), for `kubectl exec POD -- /testserver
// -get http://...` in an image that has nothing else; with -discard it
// prints how many bytes the body had and how long it took instead, for
// transfers too big to print; with -dns SERVER:PORT the URL's host name is
// resolved by that DNS server only (the agent's clusterset.local server).
// With -wait D the GET is tried again every 50 ms, name resolution
// included, until it succeeds or D passed; the body then follows a line
// "at <unix nanoseconds>" saying when the answer came.
// With -lookup-addr IP it prints the names a reverse lookup of IP gives,
// one a line (with -dns, from that server only).
// With -probe HOST:PORT it exchanges a line with a line-echo server on a
// new connection every -every, tries overlapping, and prints "ok <unix
// nanoseconds of the answer> <unix nanoseconds of the try's start>
// <the server's answer>" (the address it was seen as, the server's name
// and UID) or "fail <unix nanoseconds of the try's start> <error>" per
// try: a flow whose gaps the caller measures, and who answered it.
// With -cat FILE it prints the file and exits, for reading what a pod has
// mounted (ConfigMaps, Secrets).
// With -connect HOST:PORT it opens a TCP connection and closes it, for a
// server that speaks no line protocol (an API server): it prints the
// address it connected from and exits 0, or exits non-zero after 5 s.
// With -lookup NAME it prints the addresses NAME resolves to, one a line
// (with -dns, from that server only).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	tcpAddr := flag.String("tcp", ":9000", "address of the line-echo TCP server (empty: none)")
	httpAddr := flag.String("http", ":8080", "address of the HTTP server (empty: none)")
	get := flag.String("get", "", "fetch this URL, print its body and exit")
	discard := flag.Bool("discard", false, "with -get: print \"<bytes> <seconds>\" of the body instead of the body")
	dns := flag.String("dns", "", "with -get: resolve the URL's host with this DNS server (host:port) only")
	cat := flag.String("cat", "", "print this file and exit")
	dial := flag.String("dial", "", "send one line to this line-echo TCP server (host:port), print the answer (the address it saw us as and its name) and exit")
	wait := flag.Duration("wait", 0, "with -get: try again every 50 ms until the GET succeeds or this passed, and print when it did")
	lookupAddr := flag.String("lookup-addr", "", "print the names a reverse (PTR) lookup of this address gives, one a line, and exit")
	lookup := flag.String("lookup", "", "print the addresses this name resolves to, one a line, and exit")
	connect := flag.String("connect", "", "open a TCP connection to this address (host:port), print the local address and exit")
	probe := flag.String("probe", "", "exchange one line with this line-echo TCP server (host:port) on a new connection every -every (tries overlap), printing a line per try, until -for passed or stdout is closed")
	every := flag.Duration("every", 50*time.Millisecond, "with -probe: how often to try")
	probeTimeout := flag.Duration("timeout", time.Second, "with -probe: how long one try may take")
	probeFor := flag.Duration("for", 10*time.Minute, "with -probe: how long to go on")
	flag.Parse()
	if *probe != "" {
		os.Exit(probeEcho(os.Stdout, *probe, *every, *probeTimeout, *probeFor))
	}
	if *lookup != "" {
		os.Exit(forward(*lookup, *dns))
	}
	if *connect != "" {
		os.Exit(connectTo(*connect))
	}
	if *lookupAddr != "" {
		os.Exit(reverse(*lookupAddr, *dns))
	}
	if *dial != "" {
		os.Exit(dialEcho(*dial))
	}
	if *cat != "" {
		b, err := os.ReadFile(*cat)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Stdout.Write(b)
		os.Exit(0)
	}
	if *get != "" && *wait > 0 {
		os.Exit(fetchUntil(*get, *dns, *wait))
	}
	if *get != "" {
		os.Exit(fetch(*get, *discard, *dns))
	}
	log.SetFlags(log.LstdFlags | log.Lmicroseconds | log.LUTC)
	host, _ := os.Hostname()
	errc := make(chan error, 2)
	if *tcpAddr != "" {
		l, err := net.Listen("tcp", *tcpAddr)
		if err != nil {
			log.Fatalf("listen on %s: %v", *tcpAddr, err)
		}
		log.Printf("%s: TCP on %s", host, l.Addr())
		go func() { errc <- serveTCP(l, host, os.Getenv("POD_UID")) }()
	}
	if *httpAddr != "" {
		l, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			log.Fatalf("listen on %s: %v", *httpAddr, err)
		}
		log.Printf("%s: HTTP on %s", host, l.Addr())
		srv := &http.Server{Handler: handler(host, os.Getenv("POD_UID")), ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- srv.Serve(l) }()
	}
	log.Fatal(<-errc)
}

// resolver is the system's, or with dns (host:port) one that asks that
// server only.
func resolver(dns string) *net.Resolver {
	if dns == "" {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, dns)
	}}
}

func reverse(addr, dns string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	names, err := resolver(dns).LookupAddr(ctx, addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, n := range names {
		fmt.Println(n)
	}
	return 0
}

// fetchUntil GETs url every 50 ms until an answer is 200 OK or wait
// passed; it prints when the answer came, how many tries it took and
// how long the last one took (nanoseconds), then the answer's body.
func fetchUntil(url, dns string, wait time.Duration) int {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext:       (&net.Dialer{Resolver: resolver(dns)}).DialContext,
		DisableKeepAlives: true,
	}}
	deadline := time.Now().Add(wait)
	for tries := 1; ; tries++ {
		began := time.Now()
		resp, err := c.Get(url)
		if err == nil {
			body, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				now := time.Now()
				fmt.Printf("at %d\ntries %d\nlast-try %d\n", now.UnixNano(), tries, now.Sub(began))
				os.Stdout.Write(body)
				return 0
			}
			err = fmt.Errorf("%s %v", resp.Status, rerr)
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "GET %s for %s: last %v\n", url, wait, err)
			return 1
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fetch(url string, discard bool, dns string) int {
	timeout := 5 * time.Second
	if discard {
		timeout = 2 * time.Minute
	}
	c := &http.Client{Timeout: timeout}
	if dns != "" {
		d := &net.Dialer{Resolver: resolver(dns)}
		c.Transport = &http.Transport{DialContext: d.DialContext}
	}
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer resp.Body.Close()
	if discard {
		n, err := io.Copy(io.Discard, resp.Body)
		fmt.Printf("%d %.6f\n", n, time.Since(start).Seconds())
		if err != nil || resp.StatusCode != http.StatusOK {
			fmt.Fprintf(os.Stderr, "GET %s: %s %v\n", url, resp.Status, err)
			return 1
		}
		return 0
	}
	body, err := io.ReadAll(resp.Body)
	os.Stdout.Write(body)
	if err != nil || resp.StatusCode != http.StatusOK {
		fmt.Fprintf(os.Stderr, "GET %s: %s %v\n", url, resp.Status, err)
		return 1
	}
	return 0
}

// dialEcho is the client of serveTCP: one line out, one line back, in 5 s
// like fetch, so that a refused exchange fails the same way over TCP and
// HTTP.
func forward(name, dns string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := resolver(dns).LookupHost(ctx, name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, a := range addrs {
		fmt.Println(a)
	}
	return 0
}

func connectTo(addr string) int {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(c.LocalAddr())
	c.Close()
	return 0
}

func dialEcho(addr string) int {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(c, "hello"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Print(line)
	return 0
}

// probeEcho exchanges a line with the line-echo server at addr on a new
// connection every interval, for a flow whose gaps the caller measures:
// per try it prints "ok <unix nanoseconds> <unix nanoseconds> <answer>",
// the times being when the answer came and when its try started, the
// answer the server's line as it came (a caller checks who answered, not
// only that someone did), or "fail <unix nanoseconds> <error>", the time
// being when the try started. Tries overlap: one
// starts every interval whatever those before it are doing, so that a
// try stuck in the gap (a SYN dropped is sent again only after a second)
// does not hold back the first one after it; an answer's time, not its
// try's start, is what says the path worked again. It ends after d, or
// once stdout is closed (the caller left).
func probeEcho(w io.Writer, addr string, every, timeout, d time.Duration) int {
	var mu sync.Mutex // one line at a time
	var wg sync.WaitGroup
	closed := make(chan struct{})
	var closeOnce sync.Once
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			closeOnce.Do(func() { close(closed) })
		}
	}
	end := time.Now().Add(d)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for time.Now().Before(end) {
		wg.Go(func() {
			start := time.Now()
			line, err := exchange(addr, timeout)
			if err != nil {
				say("fail %d %s\n", start.UnixNano(), strings.ReplaceAll(err.Error(), "\n", " "))
				return
			}
			say("ok %d %d %s\n", time.Now().UnixNano(), start.UnixNano(), strings.TrimSpace(line))
		})
		select {
		case <-tick.C:
		case <-closed:
			wg.Wait()
			return 1
		}
	}
	wg.Wait()
	return 0
}

// exchange sends one line to the line-echo server at addr on a new
// connection and returns its answer.
func exchange(addr string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintln(c, "probe"); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func serveTCP(l net.Listener, host, uid string) error {
	name := strings.TrimSpace(host + " " + uid)
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
				return
			}
			peer := peerOf(c.RemoteAddr().String())
			log.Printf("tcp from %s", peer)
			fmt.Fprintf(c, "%s %s\n", peer, name)
		}()
	}
}

func handler(host, uid string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/hostname", func(w http.ResponseWriter, r *http.Request) {
		log.Printf("http %s from %s", r.URL.Path, peerOf(r.RemoteAddr))
		fmt.Fprintln(w, host)
	})
	mux.HandleFunc("/peer", func(w http.ResponseWriter, r *http.Request) {
		log.Printf("http %s from %s", r.URL.Path, peerOf(r.RemoteAddr))
		fmt.Fprintln(w, peerOf(r.RemoteAddr))
	})
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 || n > maxBytes {
			http.Error(w, fmt.Sprintf("want n=0..%d", maxBytes), http.StatusBadRequest)
			return
		}
		log.Printf("http %s n=%d from %s", r.URL.Path, n, peerOf(r.RemoteAddr))
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		io.CopyN(w, zeros{}, n)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		log.Printf("http %s from %s", r.URL.Path, peerOf(r.RemoteAddr))
		fmt.Fprintf(w, "host %s\nuid %s\npeer %s\n", host, uid, peerOf(r.RemoteAddr))
	})
	return mux
}

// maxBytes bounds /bytes: 4 GiB.
const maxBytes = 4 << 30

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// peerOf returns the address part of a remote address, IPv4 unmapped.
func peerOf(remote string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return remote
	}
	return ap.Addr().Unmap().String()
}
