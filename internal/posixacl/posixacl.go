// Package posixacl reads and writes a folder's POSIX access ACL (the
// system.posix_acl_access extended attribute) and decides, as the kernel
// does, whether it lets a user through. The broker closes a trial's folder
// with one: its owner the controller, and search for the trial's lane and
// agent alone, two users that share no group.
package posixacl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"golang.org/x/sys/unix"
)

// Attr is the extended attribute that holds a file's access ACL.
const Attr = "system.posix_acl_access"

// DefaultAttr is the extended attribute that holds a folder's default ACL,
// which files made in it inherit.
const DefaultAttr = "system.posix_acl_default"

// version is the only layout the kernel takes (POSIX_ACL_XATTR_VERSION).
const version = 2

// The entry tags, as the kernel numbers them.
const (
	UserObj  = 0x01
	User     = 0x02
	GroupObj = 0x04
	Group    = 0x08
	Mask     = 0x10
	Other    = 0x20
)

// The permission bits of an entry.
const (
	Read    = 4
	Write   = 2
	Execute = 1
)

// undefinedID is the id of an entry that names no user or group.
const undefinedID = 0xffffffff

// Entry is one line of an ACL. ID is the uid of a User entry or the gid
// of a Group entry, and ignored for the others.
type Entry struct {
	Tag  uint16
	Perm uint16
	ID   uint32
}

// Encode is the attribute's bytes for entries, sorted as the kernel wants
// them (by tag, then id). It refuses an ACL the kernel would refuse: one
// without the owner's, the group's and others' entries, or with named
// entries and no mask, or a named entry twice.
func Encode(entries []Entry) ([]byte, error) {
	es := append([]Entry(nil), entries...)
	sort.Slice(es, func(i, j int) bool {
		if es[i].Tag != es[j].Tag {
			return es[i].Tag < es[j].Tag
		}
		return es[i].ID < es[j].ID
	})
	if err := valid(es); err != nil {
		return nil, err
	}
	b := binary.LittleEndian.AppendUint32(nil, version)
	for _, e := range es {
		id := e.ID
		if e.Tag != User && e.Tag != Group {
			id = undefinedID
		}
		b = binary.LittleEndian.AppendUint16(b, e.Tag)
		b = binary.LittleEndian.AppendUint16(b, e.Perm)
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	return b, nil
}

// valid checks sorted entries as the kernel's posix_acl_valid does.
func valid(es []Entry) error {
	count := map[uint16]int{}
	for i, e := range es {
		if e.Perm&^(Read|Write|Execute) != 0 {
			return fmt.Errorf("posix acl: entry %d has permission bits %o beyond rwx", i, e.Perm)
		}
		switch e.Tag {
		case UserObj, GroupObj, Mask, Other:
		case User, Group:
			if i > 0 && es[i-1].Tag == e.Tag && es[i-1].ID == e.ID {
				return fmt.Errorf("posix acl: id %d named twice", e.ID)
			}
		default:
			return fmt.Errorf("posix acl: entry %d has unknown tag %#x", i, e.Tag)
		}
		count[e.Tag]++
	}
	for _, tag := range []uint16{UserObj, GroupObj, Other} {
		if count[tag] != 1 {
			return fmt.Errorf("posix acl: %d entries of tag %#x, want 1", count[tag], tag)
		}
	}
	if count[Mask] > 1 || count[User]+count[Group] > 0 && count[Mask] == 0 {
		return errors.New("posix acl: named entries need exactly one mask")
	}
	return nil
}

// Decode reads an attribute's bytes back into entries.
func Decode(b []byte) ([]Entry, error) {
	if len(b) < 4 || (len(b)-4)%8 != 0 {
		return nil, fmt.Errorf("posix acl: %d bytes is not a header and whole entries", len(b))
	}
	if v := binary.LittleEndian.Uint32(b); v != version {
		return nil, fmt.Errorf("posix acl: version %d, want %d", v, version)
	}
	var es []Entry
	for p := 4; p < len(b); p += 8 {
		es = append(es, Entry{
			Tag:  binary.LittleEndian.Uint16(b[p:]),
			Perm: binary.LittleEndian.Uint16(b[p+2:]),
			ID:   binary.LittleEndian.Uint32(b[p+4:]),
		})
	}
	return es, nil
}

// Get reads the access ACL of the file fd holds: nil when it has none
// beyond its mode.
func Get(fd int) ([]Entry, error) {
	buf := make([]byte, 512)
	n, err := unix.Fgetxattr(fd, Attr, buf)
	if errors.Is(err, unix.ENODATA) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return Decode(buf[:n])
}

// Set gives the file fd holds (a descriptor that is not O_PATH) entries as
// its access ACL; the kernel sets the mode's bits from it too. A file
// system without ACLs answers EOPNOTSUPP, which the caller must take as a
// refusal: the folder is not closed.
func Set(fd int, entries []Entry) error {
	b, err := Encode(entries)
	if err != nil {
		return err
	}
	return unix.Fsetxattr(fd, Attr, b, 0)
}

// Remove drops the file's access ACL, if it has one (a file system that
// keeps none has none to drop).
func Remove(fd int) error {
	if err := unix.Fremovexattr(fd, Attr); err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	return nil
}

// Allows decides, as the kernel's posix_acl_permission does, whether a
// user with uid and groups gets want (Read, Write, Execute bits) from a
// file owned by ownerUID:ownerGID with entries as its ACL. Root's
// capabilities are not the ACL's business and are left out.
func Allows(entries []Entry, ownerUID, ownerGID, uid uint32, groups []uint32, want uint16) bool {
	mask := uint16(Read | Write | Execute)
	for _, e := range entries {
		if e.Tag == Mask {
			mask = e.Perm
		}
	}
	inGroup := func(g uint32) bool {
		for _, x := range groups {
			if x == g {
				return true
			}
		}
		return false
	}
	for _, e := range entries {
		if e.Tag == UserObj && uid == ownerUID {
			return e.Perm&want == want
		}
	}
	for _, e := range entries {
		if e.Tag == User && e.ID == uid {
			return e.Perm&mask&want == want
		}
	}
	found := false
	for _, e := range entries {
		if e.Tag == GroupObj && inGroup(ownerGID) || e.Tag == Group && inGroup(e.ID) {
			found = true
			if e.Perm&mask&want == want {
				return true
			}
		}
	}
	if found {
		return false
	}
	for _, e := range entries {
		if e.Tag == Other {
			return e.Perm&want == want
		}
	}
	return false
}
