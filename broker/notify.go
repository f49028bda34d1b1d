package broker

import (
	"log/slog"
	"net"
	"os"
	"strings"
)

// notifier tells systemd where the start-up is (sd_notify): READY=1 once
// the rig serves, STATUS= lines, STOPPING=1. The protocol is one datagram
// of KEY=value lines on the unix socket NOTIFY_SOCKET names; without it,
// nothing is sent.
type notifier struct {
	addr *net.UnixAddr
	log  *slog.Logger
}

// newNotifier takes NOTIFY_SOCKET out of the environment, so no process
// the broker starts can speak for it.
func newNotifier(log *slog.Logger) *notifier {
	path := os.Getenv("NOTIFY_SOCKET")
	os.Unsetenv("NOTIFY_SOCKET")
	n := &notifier{log: log}
	switch {
	case path == "":
	case strings.HasPrefix(path, "@"):
		// An abstract socket: Go writes a leading @ as the NUL byte.
		n.addr = &net.UnixAddr{Name: path, Net: "unixgram"}
	case strings.HasPrefix(path, "/"):
		n.addr = &net.UnixAddr{Name: path, Net: "unixgram"}
	default:
		log.Warn("NOTIFY_SOCKET is neither a path nor an abstract name; not notifying", "value", path)
	}
	return n
}

// send sends one notification; a failure is logged, never fatal.
func (n *notifier) send(msg string) {
	if n == nil || n.addr == nil {
		return
	}
	c, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		n.log.Warn("sd_notify", "socket", n.addr.Name, "err", err)
		return
	}
	defer c.Close()
	if _, err := c.Write([]byte(msg)); err != nil {
		n.log.Warn("sd_notify", "socket", n.addr.Name, "err", err)
	}
}
