// Package standin is a stand-in model provider for tests: an HTTPS server
// on loopback, with a certificate authority of its own, that speaks each
// agent program's real wire protocol as far as one scripted turn needs and
// answers from a script (a tool call, then a final message). No model
// provider is reachable from the rig's machines; the agent programs take
// their provider's address from their configuration or environment.
//
// Each protocol lives in a file of its own and adds its routes to
// protocols; this file holds what they share: the server, the CA, the
// script and the record of what each program sent.
package standin

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// The wire protocols a stand-in speaks (Turn.API).
const (
	AnthropicMessages = "anthropic-messages"
	OpenAIResponses   = "openai-responses"
	OpenAIChat        = "openai-chat"
)

// protocols maps each protocol's routes (a ServeMux pattern) to its
// handler; each protocol's file fills it in an init function.
var protocols = map[string]func(*Provider) http.HandlerFunc{}

// Call is a tool call the stand-in makes: the tool's name as the program
// offered it, and its input.
type Call struct {
	Name  string
	Input map[string]any
}

// Step is one answer: a tool call, or (Tool nil) a final message.
type Step struct {
	Tool *Call
	Text string
}

// Result is a tool's result as the program sent it back.
type Result struct {
	CallID string
	Name   string
	Output string
	// IsError is whether the program reported the result as an error, and
	// Reported whether its request carried such a report at all: the
	// Messages API's is_error (on every result), Codex's exit status line
	// for its shell tools on the Responses API ("Process exited with code
	// N"). The Chat Completions API has no place for one, and Codex sends
	// none for an MCP tool: Reported is false there (IsError too), and
	// only the program's own record (its JSON events) says what it took
	// for an error.
	IsError  bool
	Reported bool
}

// Turn is what one request showed of the conversation so far.
type Turn struct {
	API   string
	Path  string
	Model string
	// Tools are the names of the tools the program offered.
	Tools []string
	// Results are the tool results in the conversation, oldest first.
	Results []Result
	// Prompt is the text of the conversation's last user message.
	Prompt string
	// Stream is whether the program asked for a streamed answer.
	Stream bool
}

// Script decides the answer to a turn.
type Script func(Turn) Step

// Steps answers the n-th request of a conversation (n = the tool results
// it carries) with steps[n], and every later one with final; a request
// that offers no tools (a title, a summary) gets final at once.
func Steps(final string, steps ...Step) Script {
	return func(t Turn) Step {
		if len(t.Tools) == 0 || len(t.Results) >= len(steps) {
			return Step{Text: final}
		}
		return steps[len(t.Results)]
	}
}

// Provider is a running stand-in.
type Provider struct {
	// URL is https://127.0.0.1:PORT, Addr its host:port.
	URL, Addr string
	// CAFile is the PEM of the certificate authority that signed its
	// certificate, mode 0644, for the program's NODE_EXTRA_CA_CERTS,
	// SSL_CERT_FILE or configuration.
	CAFile string

	t      testing.TB
	script Script
	mu     sync.Mutex
	turns  []Turn
	paths  []string
	// clients are the distinct addresses requests came from.
	clients map[string]bool
}

// Start serves a stand-in on 127.0.0.1 with script, its CA written into
// dir (which the program's user must be able to reach), until the test
// ends.
func Start(t testing.TB, dir string, script Script) *Provider {
	t.Helper()
	caPEM, cert, err := certificates()
	if err != nil {
		t.Fatalf("standin: certificates: %v", err)
	}
	p := &Provider{t: t, script: script, CAFile: filepath.Join(dir, "standin-ca.pem")}
	if err := os.WriteFile(p.CAFile, caPEM, 0o644); err != nil {
		t.Fatalf("standin: %v", err)
	}
	mux := http.NewServeMux()
	for pattern, h := range protocols {
		mux.HandleFunc(pattern, h(p))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		p.seen(r)
		t.Logf("standin: no route for %s %s", r.Method, r.URL.Path)
		http.Error(w, `{"error":{"type":"not_found_error","message":"the stand-in provider has no `+r.URL.Path+`"}}`, http.StatusNotFound)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("standin: %v", err)
	}
	p.Addr = ln.Addr().String()
	p.URL = "https://" + p.Addr
	srv := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, ReadHeaderTimeout: 10 * time.Second}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return p
}

// Answer records a turn and returns the script's step for it. Every
// protocol's handler calls it once per request that asks for a model's
// answer.
func (p *Provider) Answer(t Turn) Step {
	p.mu.Lock()
	p.turns = append(p.turns, t)
	p.mu.Unlock()
	s := p.script(t)
	if s.Tool != nil {
		p.t.Logf("standin: %s turn %d (%d tools offered): call %s %v", t.API, len(p.Turns()), len(t.Tools), s.Tool.Name, s.Tool.Input)
	} else {
		p.t.Logf("standin: %s turn %d (%d tools offered): final %q", t.API, len(p.Turns()), len(t.Tools), s.Text)
	}
	return s
}

// seen records a request's path (every request, answered or not).
func (p *Provider) seen(r *http.Request) {
	p.mu.Lock()
	p.paths = append(p.paths, r.Method+" "+r.URL.Path)
	if p.clients == nil {
		p.clients = map[string]bool{}
	}
	p.clients[r.RemoteAddr] = true
	p.mu.Unlock()
}

// Clients is how many connections (distinct client addresses) requests
// came on, for a test to compare with the tunnels its proxy recorded.
func (p *Provider) Clients() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.clients)
}

// Turns are the turns answered so far.
func (p *Provider) Turns() []Turn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Turn(nil), p.turns...)
}

// Paths are the method and path of every request so far.
func (p *Provider) Paths() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.paths...)
}

// Results are the tool results of the longest conversation seen: what the
// program showed its model of each tool call.
func (p *Provider) Results() []Result {
	var out []Result
	for _, t := range p.Turns() {
		if len(t.Results) > len(out) {
			out = t.Results
		}
	}
	return out
}

// certificates makes a CA and a certificate it signs for 127.0.0.1, ::1
// and localhost.
func certificates() (caPEM []byte, cert tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "thermite stand-in provider CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	ca, _ = x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, cert, err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, cert, err
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	cert = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	if cert.Leaf, err = x509.ParseCertificate(der); err != nil {
		return nil, cert, fmt.Errorf("leaf: %w", err)
	}
	return caPEM, cert, nil
}
