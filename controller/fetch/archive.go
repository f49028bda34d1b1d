package fetch

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Metadata is the JSON file Archive writes beside each body.
type Metadata struct {
	URL         string    `json:"url"`
	Requested   string    `json:"requested_url"`
	FetchedAt   time.Time `json:"fetched_at"`
	Status      int       `json:"status"`
	ContentType string    `json:"content_type"`
	Size        int       `json:"size"`
	SHA256      string    `json:"sha256"` // of the body
	Truncated   bool      `json:"truncated"`
	Body        string    `json:"body"` // the body file's name, in the same folder
}

// ArchiveName is the stable name Archive gives a page: the hex SHA-256 of
// the URL that was asked for (the final URL when that is unknown), so a lane
// finds a page by the URL it asked for.
func ArchiveName(p *Page) string {
	key := p.Requested
	if key == "" {
		key = p.URL
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Archive writes p into dir as NAME.body and NAME.json (see ArchiveName),
// each 0644, and returns the body's path. dir is created 0755 when missing.
// Nothing in dir is followed: dir itself must not be a symlink, each file is
// written to a fresh temporary name (O_EXCL|O_NOFOLLOW) and renamed into
// place, which replaces whatever had the name (a symlink included) rather
// than writing through it. A page archived again replaces the earlier copy;
// the body is renamed in before its metadata, so a metadata file always
// describes a complete body.
func Archive(dir string, p *Page) (path string, err error) {
	if p == nil {
		return "", errors.New("fetch: archive: no page")
	}
	dfd, err := openArchiveDir(dir)
	if err != nil {
		return "", err
	}
	defer unix.Close(dfd)

	name := ArchiveName(p)
	sum := sha256.Sum256(p.Body)
	meta, err := json.MarshalIndent(Metadata{
		URL:         p.URL,
		Requested:   p.Requested,
		FetchedAt:   p.FetchedAt.UTC(),
		Status:      p.Status,
		ContentType: p.ContentType,
		Size:        len(p.Body),
		SHA256:      hex.EncodeToString(sum[:]),
		Truncated:   p.Truncated,
		Body:        name + ".body",
	}, "", "  ")
	if err != nil {
		return "", fmt.Errorf("fetch: archive %s: metadata: %w", p.URL, err)
	}
	if err := writeFileAt(dfd, dir, name+".body", p.Body); err != nil {
		return "", err
	}
	if err := writeFileAt(dfd, dir, name+".json", append(meta, '\n')); err != nil {
		return "", err
	}
	if err := unix.Fsync(dfd); err != nil {
		return "", fmt.Errorf("fetch: archive: sync %s: %w", dir, err)
	}
	return filepath.Join(dir, name+".body"), nil
}

// openArchiveDir creates dir (0755) when missing and opens it, refusing a
// symlink in its place.
func openArchiveDir(dir string) (int, error) {
	_, err := os.Lstat(dir)
	created := false
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return -1, fmt.Errorf("fetch: archive: create %s: %w", dir, err)
		}
		created = true
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("fetch: archive: open %s (a symlink or not a folder?): %w", dir, err)
	}
	if created {
		// The umask may have taken bits: lanes read the research folder.
		if err := unix.Fchmod(dfd, 0o755); err != nil {
			unix.Close(dfd)
			return -1, fmt.Errorf("fetch: archive: chmod %s: %w", dir, err)
		}
	}
	return dfd, nil
}

// writeFileAt writes data to name in the folder dfd through a temporary
// file that cannot already exist, then renames it over name.
func writeFileAt(dfd int, dir, name string, data []byte) (err error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("fetch: archive: %w", err)
	}
	tmp := "." + name + ".tmp-" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("fetch: archive: create %s: %w", filepath.Join(dir, tmp), err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, tmp))
	defer func() {
		if err != nil {
			f.Close()
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	// 0644 whatever the umask: every lane reads the research folder.
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("fetch: archive: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("fetch: archive: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fetch: archive: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("fetch: archive: %w", err)
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		return fmt.Errorf("fetch: archive: rename into %s: %w", filepath.Join(dir, name), err)
	}
	return nil
}
