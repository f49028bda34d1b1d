package selftest

import (
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// The self-test and its probes hand over through marks, empty files one
// side makes in a folder both see (a lane's temp folder, its workspace).
// Each side waits on the kernel's word that the mark is there (inotify),
// never on a sleep: a hand-over costs the time it takes, not a poll's.

// awaitFile waits until path is there, within, or until stop closes (nil
// for never), and says whether it is. Where no inotify instance can be
// had (the user's fs.inotify.max_user_instances spent), it looks every
// millisecond instead, so a busy host slows the hand-over, not the verdict.
func awaitFile(path string, within time.Duration, stop <-chan struct{}) bool {
	there := func() bool {
		var st unix.Stat_t
		return unix.Lstat(path, &st) == nil
	}
	end := time.Now().Add(within)
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err == nil {
		defer unix.Close(fd)
		if _, err = unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ONLYDIR); err != nil {
			unix.Close(fd)
			fd = -1
		}
	} else {
		fd = -1
	}
	// stop wakes the poll through a pipe of its own.
	var wake [2]int
	if stop != nil {
		if err := unix.Pipe2(wake[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			stop = nil
		} else {
			defer unix.Close(wake[0])
			done := make(chan struct{})
			defer close(done)
			go func() {
				select {
				case <-stop:
					unix.Write(wake[1], []byte{1})
				case <-done:
				}
				unix.Close(wake[1])
			}()
		}
	}
	buf := make([]byte, 4096)
	for {
		if there() {
			return true
		}
		left := time.Until(end)
		if left <= 0 {
			return false
		}
		if stop != nil {
			select {
			case <-stop:
				return there()
			default:
			}
		}
		var fds []unix.PollFd
		wait := int(left.Milliseconds()) + 1
		if fd >= 0 {
			fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		} else {
			wait = 1
		}
		if stop != nil {
			fds = append(fds, unix.PollFd{Fd: int32(wake[0]), Events: unix.POLLIN})
		}
		unix.Poll(fds, wait)
		if fd >= 0 {
			for {
				if n, err := unix.Read(fd, buf); n <= 0 || err != nil {
					break
				}
			}
		}
	}
}
