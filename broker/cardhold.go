package broker

import (
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"thermite/fence"
	"thermite/internal/procs"
	"thermite/internal/weaken"
	"thermite/roles"
)

// heldCardWants is what the device files should be while timed runs hold
// cards: a held card's node is in its timing user's own group (0660), so
// that no other role opens it, whatever GPU group an earlier development
// run gave it; every other node is as the layout wants.
func (b *Broker) heldCardWants(l *fence.Layout, wants []fence.Want) []fence.Want {
	if weaken.Enabled && weaken.Has(weaken.SharedHeldCard) {
		return wants
	}
	b.gpu.mu.Lock()
	fixable := b.gpu.layout == nil || b.gpu.permsFixed
	b.gpu.mu.Unlock()
	if !fixable {
		// This container keeps the nodes as they came (the status says so):
		// the fence, the refused requests and the stopped holders hold the
		// card.
		return wants
	}
	gidOf := map[string]int{}
	for i, uid := range b.holds.cardHolders() {
		r, ok := b.table.ByUID(uid)
		if !ok {
			continue
		}
		for _, c := range l.Cards {
			if c.Index == i {
				gidOf[c.Path] = r.GID
			}
		}
	}
	out := make([]fence.Want, len(wants))
	for i, w := range wants {
		if gid, ok := gidOf[w.Path]; ok && l.Refused == "" {
			w.GID, w.Mode = gid, fence.NodeMode
		}
		out[i] = w
	}
	return out
}

// stopCardHolders stops every process of a role other than the holder
// that was given one of the held cards (its GPU group is among the
// process's groups): the judge and development runs take turns. Only such
// a process can have opened the card (the fence and the node's group keep
// every other off it), and the broker may not look into another user's
// descriptors (that needs CAP_SYS_PTRACE), while a process's groups are
// in its /proc status for everyone, and no role process can drop them.
// It runs after the nodes are closed to other roles, so nothing opens
// them anew meanwhile. It returns one line per process stopped, for the
// log and the timed run's record.
func (b *Broker) stopCardHolders(holder roles.Role, cards []int) []string {
	if len(cards) == 0 || weaken.Enabled && weaken.Has(weaken.SharedHeldCard) {
		return nil
	}
	b.gpu.mu.Lock()
	l := b.gpu.layout
	b.gpu.mu.Unlock()
	cardOf := map[string]int{} // a held card's GPU group (gid as /proc shows it) to the card
	for _, i := range cards {
		if gid, ok := b.groupGID(l.Group[i]); ok && l.Group[i] != "" {
			cardOf[strconv.Itoa(gid)] = i
		}
	}
	uids := map[int]bool{}
	for _, r := range b.table.Roles {
		if r.UID != holder.UID {
			uids[r.UID] = true
		}
	}
	byUID, err := procs.CountByUID("/proc", uids)
	if err != nil {
		b.log.Error("held card: cannot list processes", "err", err)
		return []string{"processes could not be listed: " + err.Error()}
	}
	var stopped []string
	for uid, pids := range byUID {
		r, _ := b.table.ByUID(uid)
		for _, pid := range pids {
			// The pidfd first, then what /proc says, then whether the
			// pidfd's process still lives: only then was what /proc said
			// its own (a live process keeps its number), and the kill,
			// through the pidfd, reaches no process that took the number
			// since.
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue // gone
			}
			st, err := procs.Status(filepath.Join("/proc", strconv.Itoa(pid), "status"))
			if err != nil || unix.PidfdSendSignal(fd, 0, nil, 0) != nil {
				unix.Close(fd)
				continue // gone
			}
			card, given := -1, false
			for _, g := range strings.Fields(st["Groups"]) {
				if c, ok := cardOf[g]; ok {
					card, given = c, true
				}
			}
			if !given {
				unix.Close(fd)
				continue
			}
			line := fmt.Sprintf("pid %d (%s) was given card %d: stopped for the timed run that holds it", pid, r.Name, card)
			err = killPidfd(fd)
			unix.Close(fd)
			if err != nil {
				line = fmt.Sprintf("pid %d (%s) was given card %d: could not be stopped for the timed run that holds it: %v", pid, r.Name, card, err)
			}
			b.log.Warn("held card", "holder", holder.Name, "what", line)
			stopped = append(stopped, line)
		}
	}
	sort.Strings(stopped)
	return stopped
}

// killPidfd sends SIGKILL through a pidfd, so a recycled pid is never
// hit, and waits (up to a second) until the process has let go of its
// files.
func killPidfd(fd int) error {
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && err != unix.ESRCH {
		return err
	}
	// The pidfd turns readable when the process has exited (its files are
	// closed by then), reaped or not.
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		n, err := unix.Poll(pfd, int(time.Until(deadline).Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if n > 0 {
			return nil
		}
		break
	}
	return fmt.Errorf("still running a second after SIGKILL")
}
