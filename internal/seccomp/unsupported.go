//go:build linux && !(amd64 || arm64)

package seccomp

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Program fails: this package knows the system-call numbers of linux/amd64
// and linux/arm64 only, and a filter built on wrong numbers would protect
// nothing.
func Program(o Options) ([]unix.SockFilter, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("seccomp: no filter for %s/%s", runtime.GOOS, runtime.GOARCH)
}

// Install fails closed, as Program does.
func Install(o Options) error {
	_, err := Program(o)
	return err
}
