package controller

import (
	"io"
	"log/slog"
	"net"
	"testing"
)

// TestAgentFillsAnotherAgentsProxyBudgetRefused: every peer of an
// agent's egress proxy is 127.0.0.1 (of its own namespace), so the budget
// counts each listener as its role: one agent that holds its share of
// connections leaves another's proxy, and the API's loopback clients,
// theirs.
func TestAgentFillsAnotherAgentsProxyBudgetRefused(t *testing.T) {
	budget := newConnBudget(10, 1, 2, slog.New(slog.NewTextHandler(io.Discard, nil)))
	listen := func(peer string) net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return &budgetListener{Listener: l, budget: budget, peer: peer}
	}
	accepted := func(l net.Listener) bool {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		got := make(chan net.Conn, 1)
		go func() {
			if s, err := l.Accept(); err == nil {
				got <- s
			}
		}()
		// A connection the budget refuses is closed at once: its client
		// reads EOF. One admitted is handed to the server.
		closed := make(chan struct{})
		go func() {
			io.Copy(io.Discard, c)
			close(closed)
		}()
		select {
		case s := <-got:
			t.Cleanup(func() { s.Close() })
			return true
		case <-closed:
			return false
		}
	}
	a1, a2, api := listen("role agent-1"), listen("role agent-2"), listen("")
	if !accepted(a1) {
		t.Fatal("agent-1's first connection refused")
	}
	if accepted(a1) {
		t.Error("agent-1's second connection admitted past max_conns_per_peer 1")
	}
	if !accepted(a2) {
		t.Error("agent-2's first connection refused: agent-1's count taken for it")
	}
	if !accepted(api) {
		t.Error("a loopback client of the API refused: agent-1's count taken for 127.0.0.1")
	}
}
