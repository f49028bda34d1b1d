package mountinfo

import (
	"reflect"
	"testing"
)

func TestParseReadsEachWholeLine(t *testing.T) {
	got := Parse(`36 35 98:0 /docker/abc /sys/fs/cgroup/my\040mem rw,noatime master:1 shared:2 - cgroup cgroup rw,memory,release_agent=/x
40 35 0:30 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2
31 22 7:0 / /var/lib/thermite\040x rw - ext4 /dev/loop\0400 rw,quota
bad line
41 35 0:31 / /short rw - tmpfs
`)
	want := []Mount{
		{Device: "98:0", Root: "/docker/abc", Point: "/sys/fs/cgroup/my mem", Options: []string{"rw", "noatime"}, Type: "cgroup", Source: "cgroup", Super: []string{"rw", "memory", "release_agent=/x"}},
		{Device: "0:30", Root: "/", Point: "/sys/fs/cgroup", Options: []string{"ro", "nosuid"}, Type: "cgroup2", Source: "cgroup2"},
		{Device: "7:0", Root: "/", Point: "/var/lib/thermite x", Options: []string{"rw"}, Type: "ext4", Source: "/dev/loop 0", Super: []string{"rw", "quota"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Parse:\n got %+v\nwant %+v", got, want)
	}
}

func TestUnescapeUndoesOctalEscapesOnly(t *testing.T) {
	for in, want := range map[string]string{
		`plain`:         "plain",
		`a\040b`:        "a b",
		`tab\011nl\012`: "tab\tnl\n",
		`back\134slash`: `back\slash`,
		`not\08x`:       `not\08x`,
		`short\04`:      `short\04`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
