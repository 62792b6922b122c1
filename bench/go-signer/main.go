// The benchmark's yardstick (issue 21): what a platform team would write
// instead of this proxy, in Go's standard library only. A reverse proxy
// (net/http/httputil.ReverseProxy) that signs every request as the proxy does
// (src/token/token.ts): message <accessKey>:<timestamp>:<nonce>, signature
// base64(HMAC-SHA256(secret, message)), token
// <accessKey>/<timestamp>/<nonce>/<signature>, header
// "Bearer " + url.QueryEscape(token) (COS_TOKEN_ENCODING=url, the default).
// Timestamps are ns since the epoch, strictly increasing; nonces 16 bytes
// from crypto/rand as 32 hex characters.
//
// Environment: BENCH_UPSTREAM (origin), COS_ACCESS_KEY, COS_ACCESS_KEY_SECRET,
// BENCH_UPSTREAM_MAX_CONNECTIONS (the proxy's COS_UPSTREAM_MAX_CONNECTIONS
// default, 256). Run with GOMAXPROCS=1 to match one Node process. Listens on
// 127.0.0.1 (ephemeral port), prints {"port":N} on stdout, and exits when its
// stdin closes (the benchmark died) or on SIGTERM.
package main

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// Headers the proxy never forwards (src/proxy/upstream-headers.ts); the hop-by-hop
// ones ReverseProxy drops itself.
var dropped = []string{"Authorization", "Proxy-Authorization", "Forwarded", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Forwarded-Port", "X-Forwarded-Prefix", "X-Real-Ip"}

type signer struct {
	accessKey string
	secret    []byte
	last      int64 // the last timestamp handed out, atomically
}

// timestamp: ns since the epoch, strictly increasing across goroutines.
func (s *signer) timestamp() int64 {
	for {
		now := time.Now().UnixNano()
		last := atomic.LoadInt64(&s.last)
		if now <= last {
			now = last + 1
		}
		if atomic.CompareAndSwapInt64(&s.last, last, now) {
			return now
		}
	}
}

func (s *signer) header() string {
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		panic(err)
	}
	ts := strconv.FormatInt(s.timestamp(), 10)
	nonce := hex.EncodeToString(raw[:])
	mac := hmac.New(sha256.New, s.secret)
	io.WriteString(mac, s.accessKey+":"+ts+":"+nonce)
	sig := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	return "Bearer " + url.QueryEscape(s.accessKey+"/"+ts+"/"+nonce+"/"+sig)
}

func must(name string) string {
	v := os.Getenv(name)
	if v == "" {
		fmt.Fprintf(os.Stderr, "go-signer: %s is not set\n", name)
		os.Exit(64)
	}
	return v
}

func main() {
	upstream, err := url.Parse(must("BENCH_UPSTREAM"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "go-signer: BENCH_UPSTREAM: %v\n", err)
		os.Exit(64)
	}
	conns := 256
	if v := os.Getenv("BENCH_UPSTREAM_MAX_CONNECTIONS"); v != "" {
		if conns, err = strconv.Atoi(v); err != nil || conns < 1 {
			fmt.Fprintln(os.Stderr, "go-signer: BENCH_UPSTREAM_MAX_CONNECTIONS must be a whole number ≥ 1")
			os.Exit(64)
		}
	}
	s := &signer{accessKey: must("COS_ACCESS_KEY"), secret: []byte(must("COS_ACCESS_KEY_SECRET"))}
	// http.DefaultTransport keeps 2 idle connections per host: under load
	// every other request would open a new one. Sized as the proxy's pool.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxConnsPerHost = conns
	transport.MaxIdleConnsPerHost = conns
	transport.MaxIdleConns = conns
	proxy := &httputil.ReverseProxy{
		Transport: transport,
		Director: func(r *http.Request) {
			r.URL.Scheme = upstream.Scheme
			r.URL.Host = upstream.Host
			r.Host = upstream.Host
			for _, h := range dropped {
				r.Header.Del(h)
			}
			// nil, not deleted: ReverseProxy would add the client's address.
			r.Header["X-Forwarded-For"] = nil
			r.Header.Set("Authorization", s.header())
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "go-signer: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("{\"port\":%d}\n", ln.Addr().(*net.TCPAddr).Port)
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		os.Exit(0)
	}()
	server := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	if err := server.Serve(ln); err != nil {
		fmt.Fprintf(os.Stderr, "go-signer: %v\n", err)
		os.Exit(1)
	}
}
