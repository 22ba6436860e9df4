// tlstool: the TLS peers of the wire-truth tests, on Go's net/http (a pool
// that always keeps a reader, and that closes idle connections with a TLS
// close_notify). Built by the tests with `GO111MODULE=off go build`, with
// Debian's golang-golang-x-net-dev on the GOPATH (/usr/share/gocode).
//
//	tlstool cert DIR                      write DIR/cert.pem and DIR/key.pem
//	tlstool server ADDR IDLE              HTTPS server closing idle conns after IDLE
//	tlstool h2c-server ADDR IDLE          cleartext HTTP/2 (prior knowledge) on
//	                                      x/net/http2: an idle connection gets a
//	                                      GOAWAY after IDLE and its FIN a second
//	                                      later (goAwayTimeout), no close_notify
//	tlstool client URL IDLE_CONN WAIT [again]
//	                                      one GET, then keep the pool WAIT long
//	                                      (and GET again)
//	tlstool defaults URL GAPS DNS         GETs GAPS (seconds, comma-separated)
//	                                      apart on the default transport's pool
//	                                      (IdleConnTimeout 90 s), the URL's host
//	                                      name resolved by the DNS server at DNS
//	tlstool h2 URL GAPS                   the same on HTTP/2 (the default
//	                                      transport negotiates h2 by ALPN);
//	                                      one JSON line per GET: proto, error
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
)

func selfSigned() (certPEM, keyPEM []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	tmpl := x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "observer-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, &tmpl, &key.PublicKey, key)
	must(err)
	kder, err := x509.MarshalECPrivateKey(key)
	must(err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func dur(s string) time.Duration {
	d, err := time.ParseDuration(s)
	must(err)
	return d
}

func main() {
	switch os.Args[1] {
	case "cert":
		c, k := selfSigned()
		must(os.WriteFile(filepath.Join(os.Args[2], "cert.pem"), c, 0o600))
		must(os.WriteFile(filepath.Join(os.Args[2], "key.pem"), k, 0o600))
	case "server":
		c, k := selfSigned()
		cert, err := tls.X509KeyPair(c, k)
		must(err)
		srv := &http.Server{
			IdleTimeout: dur(os.Args[3]),
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write([]byte("ok\n"))
			}),
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		}
		ln, err := net.Listen("tcp", os.Args[2])
		must(err)
		fmt.Println("ready")
		must(srv.ServeTLS(ln, "", ""))
	case "h2c-server":
		ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("ok\n"))
		})
		srv := &http.Server{Handler: h2c.NewHandler(ok, &http2.Server{IdleTimeout: dur(os.Args[3])})}
		ln, err := net.Listen("tcp", os.Args[2])
		must(err)
		fmt.Println("ready")
		must(srv.Serve(ln))
	case "defaults":
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
		res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "udp", os.Args[4])
		}}
		tr.DialContext = (&net.Dialer{Resolver: res, Timeout: 5 * time.Second}).DialContext
		client := &http.Client{Transport: tr}
		for _, g := range strings.Split(os.Args[3], ",") {
			time.Sleep(dur(g + "s"))
			resp, err := client.Get(os.Args[2])
			must(err)
			io.ReadAll(resp.Body)
			resp.Body.Close()
			fmt.Println("status", resp.StatusCode)
		}
	case "h2":
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
		client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		for _, g := range strings.Split(os.Args[3], ",") {
			time.Sleep(dur(g + "s"))
			rec := map[string]interface{}{"gap": g}
			resp, err := client.Get(os.Args[2])
			if err != nil {
				rec["error"] = err.Error()
			} else {
				io.ReadAll(resp.Body)
				resp.Body.Close()
				rec["proto"] = resp.Proto
			}
			out, _ := json.Marshal(rec)
			fmt.Println(string(out))
		}
	case "client":
		var local string
		dialer := &net.Dialer{}
		tr := &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
			IdleConnTimeout: dur(os.Args[3]),
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				conn, err := dialer.DialContext(ctx, network, addr)
				if err == nil {
					local = conn.LocalAddr().String()
				}
				return conn, err
			},
		}
		client := &http.Client{Transport: tr}
		get := func() {
			resp, err := client.Get(os.Args[2])
			must(err)
			io.ReadAll(resp.Body)
			resp.Body.Close()
			host, port, err := net.SplitHostPort(local)
			must(err)
			out, _ := json.Marshal(map[string]interface{}{"local": []string{host, port}, "status": resp.StatusCode})
			fmt.Println(string(out))
		}
		get()
		time.Sleep(dur(os.Args[4]))
		// `again`: a second GET after the wait (on a pooled connection if
		// it is still alive, on a fresh one if the pool discarded it).
		if len(os.Args) > 5 && os.Args[5] == "again" {
			get()
		}
	}
}
