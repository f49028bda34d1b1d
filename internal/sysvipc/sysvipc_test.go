package sysvipc

import (
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Headers and lines as Linux 6.x prints them.
const (
	shmText = `       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap
         0         11  1666                  4096  1234  1234      1 40101 40101 40101 40101          0          0 1700000000                  4096                     0
1234567890         12   600                  4096  1234  1234      0 40102 40102 40101 40101          0          0 1700000000                     0                     0
         0         13   600                  4096  1234  1234      0 40103 40103 40103 40103          0          0 1700000000                     0                     0
`
	msgText = `       key      msqid perms      cbytes       qnum lspid lrpid   uid   gid  cuid  cgid      stime      rtime      ctime
        -1          3   600           0          0     0     0 40101 40101 40101 40101          0          0 1700000000
`
	semText = `       key      semid perms      nsems   uid   gid  cuid  cgid      otime      ctime
         0          5   600          1 40104 40104 40101 40101          0 1700000000
`
)

func TestParse(t *testing.T) {
	shm, err := Parse(Shm, []byte(shmText))
	if err != nil || len(shm) != 3 {
		t.Fatalf("shm: %v %+v", err, shm)
	}
	if o := shm[0]; o.ID != 11 || o.Mode != 0o1666 || o.UID != 40101 || o.CUID != 40101 {
		t.Errorf("shm[0]: %+v", o)
	}
	if o := shm[1]; o.Key != 1234567890 || o.UID != 40102 || o.CUID != 40101 {
		t.Errorf("shm[1]: %+v", o)
	}
	msg, err := Parse(Msg, []byte(msgText))
	if err != nil || len(msg) != 1 || msg[0].ID != 3 || msg[0].Key != -1 {
		t.Fatalf("msg: %v %+v", err, msg)
	}
	sem, err := Parse(Sem, []byte(semText))
	if err != nil || len(sem) != 1 || sem[0].ID != 5 || sem[0].UID != 40104 || sem[0].CUID != 40101 {
		t.Fatalf("sem: %v %+v", err, sem)
	}
	// Which of these go when uid 40101 is stopped: its own, the one it made
	// and handed to 40102, the semaphore it handed to 40104; not shm 11,
	// removed already and waiting for its last detach, nor 40103's.
	var got []int
	for _, o := range append(append(shm, msg...), sem...) {
		if belongsTo(o, 40101) {
			got = append(got, o.ID)
		}
	}
	if want := []int{12, 3, 5}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("objects of uid 40101: %v, want %v", got, want)
	}
	if _, err := Parse(Shm, []byte("key shmid perms size\n")); err == nil {
		t.Error("a header without uid and cuid was accepted")
	}
}

// makeOwned makes a private object as root and gives it to uid with
// IPC_SET, as a role's own object would be.
func makeOwned(t *testing.T, kind string, uid int) Object {
	t.Helper()
	var id uintptr
	var errno unix.Errno
	switch kind {
	case Shm:
		id, _, errno = unix.Syscall(unix.SYS_SHMGET, unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
	case Msg:
		id, _, errno = unix.Syscall(unix.SYS_MSGGET, unix.IPC_PRIVATE, unix.IPC_CREAT|0o600, 0)
	case Sem:
		id, _, errno = unix.Syscall(unix.SYS_SEMGET, unix.IPC_PRIVATE, 1, unix.IPC_CREAT|0o600)
	}
	if errno != 0 {
		t.Fatalf("%sget: %v", kind, errno)
	}
	o := Object{Kind: kind, ID: int(id)}
	t.Cleanup(func() { Remove(o) })
	// struct ipc64_perm starts every *id_ds: key, uid, gid, cuid, cgid (4 bytes each).
	buf := make([]byte, 512)
	ctl := func(cmd uintptr) unix.Errno {
		var e unix.Errno
		switch kind {
		case Shm:
			_, _, e = unix.Syscall(unix.SYS_SHMCTL, id, cmd, uintptr(unsafe.Pointer(&buf[0])))
		case Msg:
			_, _, e = unix.Syscall(unix.SYS_MSGCTL, id, cmd, uintptr(unsafe.Pointer(&buf[0])))
		case Sem:
			_, _, e = unix.Syscall6(unix.SYS_SEMCTL, id, 0, cmd, uintptr(unsafe.Pointer(&buf[0])), 0, 0)
		}
		return e
	}
	if e := ctl(unix.IPC_STAT); e != 0 {
		t.Fatalf("IPC_STAT: %v", e)
	}
	*(*uint32)(unsafe.Pointer(&buf[4])) = uint32(uid)
	if e := ctl(unix.IPC_SET); e != 0 {
		t.Fatalf("IPC_SET: %v", e)
	}
	return o
}

func TestRemoveUserObjects(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: it makes objects and gives them to other uids")
	}
	const uid, other = 4242001, 4242002
	for _, k := range Kinds {
		makeOwned(t, k, uid)
	}
	keep := makeOwned(t, Shm, other)
	n, err := RemoveUserObjects("/proc", uid, time.Second)
	if err != nil || n != 3 {
		t.Fatalf("removed %d, %v; want 3", n, err)
	}
	objs, err := List("/proc")
	if err != nil {
		t.Fatal(err)
	}
	kept := false
	for _, o := range objs {
		if o.UID == uid {
			t.Errorf("left: %s", o)
		}
		if o.ID == keep.ID && o.Kind == Shm && o.UID == other {
			kept = true
		}
	}
	if !kept {
		t.Errorf("another uid's segment was removed")
	}
}
