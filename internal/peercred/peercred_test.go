package peercred

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// The credentials are the connecting process's own, as the kernel saw it.
func TestOfIsTheConnectingProcess(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		done <- c
	}()
	c, err := net.Dial("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := <-done
	defer srv.Close()
	cred, err := Of(srv.(*net.UnixConn))
	if err != nil {
		t.Fatal(err)
	}
	if int(cred.Uid) != os.Getuid() || int(cred.Pid) != os.Getpid() {
		t.Fatalf("peer uid %d pid %d, want %d %d", cred.Uid, cred.Pid, os.Getuid(), os.Getpid())
	}
}
