package controller

import (
	"errors"
	"io/fs"
	"slices"
	"syscall"
	"testing"
	"time"
)

// fakeEntry is an lstat's answer with the owner and mode a case needs.
type fakeEntry struct {
	mode fs.FileMode
	uid  uint32
}

func (f fakeEntry) Name() string       { return "thermite.ts" }
func (f fakeEntry) Size() int64        { return 1 }
func (f fakeEntry) Mode() fs.FileMode  { return f.mode }
func (f fakeEntry) ModTime() time.Time { return time.Time{} }
func (f fakeEntry) IsDir() bool        { return f.mode.IsDir() }
func (f fakeEntry) Sys() any           { return &syscall.Stat_t{Uid: f.uid} }

func TestPiExtensionFault(t *testing.T) {
	for _, c := range []struct {
		name string
		fi   fs.FileInfo
		err  error
		want string
	}{
		{"root's 0644 file", fakeEntry{0o644, 0}, nil, ""},
		{"root's 0444 file", fakeEntry{0o444, 0}, nil, ""},
		{"missing", nil, fs.ErrNotExist, "missing"},
		{"unreadable folder on the way", nil, fs.ErrPermission, "permission denied"},
		{"group-writable", fakeEntry{0o664, 0}, nil, "writable by others (mode 0664)"},
		{"writable by all", fakeEntry{0o666, 0}, nil, "writable by others (mode 0666)"},
		{"another user's", fakeEntry{0o644, 1000}, nil, "owned by uid 1000, not root"},
		{"a symlink", fakeEntry{fs.ModeSymlink | 0o777, 0}, nil, "a symlink, not the file itself"},
		{"a fifo", fakeEntry{fs.ModeNamedPipe | 0o644, 0}, nil, "not a regular file (p---------)"},
		{"root's 0755 folder", fakeEntry{fs.ModeDir | 0o755, 0}, nil, ""},
		{"a folder all may write", fakeEntry{fs.ModeDir | 0o777, 0}, nil, "writable by others (mode 0777)"},
		{"a sticky folder all may write (/tmp)", fakeEntry{fs.ModeDir | fs.ModeSticky | 0o777, 0}, nil, ""},
		{"another user's sticky folder", fakeEntry{fs.ModeDir | fs.ModeSticky | 0o777, 5}, nil, "owned by uid 5, not root"},
	} {
		if got := piExtensionFault(c.fi, c.err); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := piExtensionFault(nil, errors.New("lstat x: input/output error")); got != "lstat x: input/output error" {
		t.Errorf("an lstat that fails: %q, want its error", got)
	}
}

func TestRunsPi(t *testing.T) {
	for _, c := range []struct {
		argv []string
		want bool
	}{
		{[]string{"/opt/thermite/agents/node_modules/.bin/pi", "-p", "hi"}, true},
		{[]string{"pi"}, true},
		{[]string{"node", "/opt/thermite/agents/node_modules/@mariozechner/pi-coding-agent/dist/cli.js", "-p"}, true},
		{[]string{"/usr/bin/node", "/srv/pi-coding-agent/dist/cli.js"}, true},
		{[]string{"sh", "-c", "pi -p hi"}, false},
		{[]string{"pip", "install"}, false},
		{[]string{"node", "server.js"}, false},
		{nil, false},
	} {
		if got := runsPi(c.argv); got != c.want {
			t.Errorf("runsPi(%q) = %v, want %v", c.argv, got, c.want)
		}
	}
}

func TestPiArgvNamesTheExtension(t *testing.T) {
	const ext = "/opt/thermite/agents/pi-extension/thermite.ts"
	for _, c := range []struct{ argv, want []string }{
		{[]string{"pi", "-p", "hi"}, []string{"pi", "--extension", ext, "-p", "hi"}},
		{[]string{"/x/.bin/pi"}, []string{"/x/.bin/pi", "--extension", ext}},
		{[]string{"node", "/x/pi-coding-agent/dist/cli.js", "-p", "hi"}, []string{"node", "/x/pi-coding-agent/dist/cli.js", "--extension", ext, "-p", "hi"}},
	} {
		argv := append([]string{}, c.argv...)
		if got := piArgv(argv, ext); !slices.Equal(got, c.want) || !slices.Equal(argv, c.argv) {
			t.Errorf("piArgv(%q) = %q (argv now %q), want %q and argv as it was", c.argv, got, argv, c.want)
		}
	}
}
