package broker

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"thermite/internal/confined"
	"thermite/internal/posixacl"
	"thermite/internal/rpc"
	"thermite/internal/weaken"
	"thermite/roles"
)

// TrialFolderMode is a trial's folder once it is closed, as stat shows it:
// the controller's, its group bits the ACL's mask (search only), nothing
// for others.
const TrialFolderMode = 0o710

// TrialGate decides who passes a trial's folder (scratch/trials/<id>): the
// controller, its owner, with every right; the trial's lane and that
// lane's agent with search only, by name in the folder's ACL; nobody else,
// not the owner's group, not another lane or agent, not the judge's users.
// What the folder holds (the workspace, the lane harness's home, the agent
// folder) is its lane's or agent's own, mode and all: a lane that opens
// its workspace to every role (git wants the workspace's top to be the
// lane's, so its mode is the lane's to change) opens it to its own agent
// at most. Lane and agent share no group, hence an ACL, not a group.
func TrialGate(t *roles.Table, laneName string) ([]posixacl.Entry, error) {
	lane, ok := t.Role(laneName)
	if !ok || lane.Kind != roles.Lane {
		return nil, fmt.Errorf("%s is not a lane", laneName)
	}
	agent, ok := t.Agent(lane.Index)
	if !ok {
		return nil, fmt.Errorf("%s has no agent in the role table", laneName)
	}
	return []posixacl.Entry{
		{Tag: posixacl.UserObj, Perm: posixacl.Read | posixacl.Write | posixacl.Execute},
		{Tag: posixacl.User, Perm: posixacl.Execute, ID: uint32(lane.UID)},
		{Tag: posixacl.User, Perm: posixacl.Execute, ID: uint32(agent.UID)},
		{Tag: posixacl.GroupObj},
		{Tag: posixacl.Mask, Perm: posixacl.Execute},
		{Tag: posixacl.Other},
	}, nil
}

// TrialFolder closes a trial's folder to every role but its lane and the
// lane's agent (TrialGate): only a folder directly in scratch/trials that
// the controller owns. A file system that keeps no ACL refuses the trial
// with one line naming it: the folder would otherwise let every role pass
// to whatever the lane opens inside it.
func (b *Broker) TrialFolder(req *rpc.TrialFolderRequest) error {
	entries, err := TrialGate(b.table, req.Lane)
	if err != nil {
		return fmt.Errorf("trial_folder: %w", err)
	}
	trials := filepath.Join(b.cfg.ScratchDir(), "trials")
	p := filepath.Clean(req.Path)
	if filepath.Dir(p) != trials || filepath.Base(p) == "." || filepath.Base(p) == ".." {
		return fmt.Errorf("trial_folder: %s: not a folder directly in %s", req.Path, trials)
	}
	f, err := confined.Open(trials, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("trial_folder: %w", err)
	}
	defer f.Close()
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("trial_folder: %s: %w", p, err)
	}
	ctl := b.table.Controller()
	if int(st.Uid) != ctl.UID {
		return fmt.Errorf("trial_folder: %s: owned by uid %d, not the controller's", p, st.Uid)
	}
	if err := unix.Fchown(fd, ctl.UID, ctl.GID); err != nil {
		return fmt.Errorf("trial_folder: %s: %w", p, err)
	}
	if weaken.Enabled && weaken.Has(weaken.LaneFoldersOpen) {
		// The self-test's breakage test: the folder as it was before issue
		// 27, searchable by every user.
		return unix.Fchmod(fd, 0o711)
	}
	// Closed first, so that no moment of the change lets more through.
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return fmt.Errorf("trial_folder: %s: %w", p, err)
	}
	if err := posixacl.Set(fd, entries); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("trial_folder: %s: the file system keeps no POSIX ACL (%w): a trial's folder cannot be closed to every role but its lane and agent; put the state dir on one that does (ext4, xfs, btrfs, tmpfs)", p, err)
		}
		return fmt.Errorf("trial_folder: %s: set its ACL: %w", p, err)
	}
	return nil
}
