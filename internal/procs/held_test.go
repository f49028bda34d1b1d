package procs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A mapping of a deleted file counts its mapped length, once per inode at
// its largest; a mapping of a file with a name, or an anonymous one, not.
func TestDeletedMappings(t *testing.T) {
	maps := filepath.Join(t.TempDir(), "maps")
	os.WriteFile(maps, []byte(`55d0c0000000-55d0c0002000 r--p 00000000 08:01 1234 /usr/bin/cat
7f0000000000-7f0000100000 rw-s 00000000 08:01 777 /work/big (deleted)
7f0000200000-7f0000201000 r--s 00000000 08:01 777 /work/big (deleted)
7f0000300000-7f0000302000 rw-s 00000000 00:01 99 /memfd:x (deleted)
7f0000400000-7f0000500000 rw-p 00000000 00:00 0 
7f0000600000-7f0000601000 r--p 00000000 08:01 55 /work/a file named (deleted) not
`), 0o644)
	got := deletedMappings(maps)
	big := struct{ dev, ino uint64 }{unix.Mkdev(8, 1), 777}
	memfd := struct{ dev, ino uint64 }{unix.Mkdev(0, 1), 99}
	if len(got) != 2 || got[big] != 1<<20 || got[memfd] != 2<<12 {
		t.Fatalf("deletedMappings = %v; want %v: 1 MiB and %v: 8 KiB", got, big, memfd)
	}
}
