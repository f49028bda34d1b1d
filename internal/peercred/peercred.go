// Package peercred says who is at the other end of a unix socket: the
// credentials the kernel recorded when the peer connected (SO_PEERCRED),
// never anything the peer says of itself. It is the one peer check of
// every thermite server: the broker's RPC, the controller's operator
// socket and the harness API's budgets.
package peercred

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Of is the uid, gid and pid of the process that connected conn.
func Of(conn syscall.Conn) (*unix.Ucred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("peer credentials: %w", cerr)
	}
	if cred == nil {
		return nil, errors.New("peer credentials: none")
	}
	return cred, nil
}
