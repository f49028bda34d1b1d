package lanefs

import (
	"encoding/json"
	"time"
)

// Every request names its root folder by index into the helper's command
// line (0 is the trial's workspace) and a path relative to it. Unknown
// fields are refused.

// ReadRequest reads up to Limit bytes from Offset (0 or over MaxRead: MaxRead).
type ReadRequest struct {
	Root   int    `json:"root"`
	Path   string `json:"path"`
	Offset int64  `json:"offset,omitempty"`
	Limit  int64  `json:"limit,omitempty"`
}

// ReadResponse is what was read, the file's whole size, and whether the
// file goes on past what was read.
type ReadResponse struct {
	Data      []byte `json:"data"`
	Size      int64  `json:"size"`
	Truncated bool   `json:"truncated"`
}

// WriteRequest replaces (or creates) a file with Data: through a new file
// in the same folder, renamed over the name, so a reader sees the old
// content or the new, and a symlink at the name is replaced, never
// followed. Mode 0 keeps the mode of the regular file it replaces, or 0644
// for a new file; otherwise it is the new file's mode (0 to 0777).
type WriteRequest struct {
	Root          int    `json:"root"`
	Path          string `json:"path"`
	Data          []byte `json:"data"`
	Mode          uint32 `json:"mode,omitempty"`
	CreateParents bool   `json:"create_parents,omitempty"`
}

// WriteResponse is the new file's size.
type WriteResponse struct {
	Size int64 `json:"size"`
}

// EditRequest replaces Old, which must occur exactly once, with New,
// atomically like write, keeping the file's mode. A symlink is refused.
type EditRequest struct {
	Root int    `json:"root"`
	Path string `json:"path"`
	Old  string `json:"old"`
	New  string `json:"new"`
}

// EditResponse is the edited file's size.
type EditResponse struct {
	Size int64 `json:"size"`
}

// ListRequest lists a folder (an empty path is the root).
type ListRequest struct {
	Root int    `json:"root"`
	Path string `json:"path"`
}

// ListResponse holds the entries sorted by name; Truncated when there were
// more than MaxList.
type ListResponse struct {
	Entries   []Entry `json:"entries"`
	Truncated bool    `json:"truncated"`
}

// The entry types.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other"
)

// Entry is one name in a folder, as lstat sees it. Target is a symlink's
// text (never followed).
type Entry struct {
	Name   string    `json:"name"`
	Type   string    `json:"type"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	MTime  time.Time `json:"mtime"`
	Target string    `json:"target,omitempty"`
}

// StatRequest describes one entry without following a final symlink (an
// empty path is the root).
type StatRequest struct {
	Root int    `json:"root"`
	Path string `json:"path"`
}

// StatResponse is the entry.
type StatResponse struct {
	Entry
}

// DeleteRequest removes a file, a symlink (never what it points to) or an
// empty folder; a folder with content only with Recursive.
type DeleteRequest struct {
	Root      int    `json:"root"`
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// DeleteResponse counts the entries removed.
type DeleteResponse struct {
	Removed int `json:"removed"`
}

// MkdirRequest makes a folder (mode 0 is 0755). With Parents, missing
// folders on the way are made too and an existing folder is no error.
type MkdirRequest struct {
	Root    int    `json:"root"`
	Path    string `json:"path"`
	Parents bool   `json:"parents,omitempty"`
	Mode    uint32 `json:"mode,omitempty"`
}

// MkdirResponse says whether the folder was made (false: it was there).
type MkdirResponse struct {
	Created bool `json:"created"`
}

// GrepRequest searches regular files for lines that match Pattern (Go
// regexp syntax). Path may be a file or a folder (empty: the root), which
// is walked without following symlinks. Glob, when set, filters files by
// name (filepath.Match), or by the path below Path when it has a slash.
// MaxMatches 0 is DefaultMatches, and more than MaxMatches is MaxMatches.
// Files with a NUL byte in their first 8000 bytes are skipped as binary.
type GrepRequest struct {
	Root       int    `json:"root"`
	Path       string `json:"path"`
	Pattern    string `json:"pattern"`
	Glob       string `json:"glob,omitempty"`
	MaxMatches int    `json:"max_matches,omitempty"`
}

// Match is one matching line (cut to MaxLine bytes). Path is relative to
// the root, so it can be given back to read.
type Match struct {
	Path   string `json:"path"`
	LineNo int    `json:"line_no"`
	Line   string `json:"line"`
}

// GrepResponse holds the matches in walk order (names sorted);
// Truncated when the cap stopped the search.
type GrepResponse struct {
	Matches       []Match `json:"matches"`
	Truncated     bool    `json:"truncated"`
	FilesScanned  int     `json:"files_scanned"`
	BinarySkipped int     `json:"binary_skipped"`
}

// FindRequest lists the paths below the folder Path (empty: the root)
// whose name matches Glob (filepath.Match; by the path below Path when it
// has a slash; empty: every entry). Symlinks are listed, never followed.
// Max 0 is DefaultFind, and more than MaxFind is MaxFind.
type FindRequest struct {
	Root int    `json:"root"`
	Path string `json:"path"`
	Glob string `json:"glob,omitempty"`
	Max  int    `json:"max,omitempty"`
}

// FindResponse holds root-relative paths in walk order (names sorted).
type FindResponse struct {
	Paths     []string `json:"paths"`
	Truncated bool     `json:"truncated"`
}

// wireRequest is a request as the server decodes it.
type wireRequest struct {
	ID   uint64          `json:"id"`
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args"`
}

// outRequest is a request as the client encodes it.
type outRequest struct {
	ID   uint64 `json:"id"`
	Op   string `json:"op"`
	Args any    `json:"args"`
}

// wireResponse is an answer as the client decodes it.
type wireResponse struct {
	ID     uint64          `json:"id"`
	Error  *Error          `json:"error,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
}

// outResponse is an answer as the server encodes it.
type outResponse struct {
	ID     uint64 `json:"id"`
	Error  *Error `json:"error,omitempty"`
	Result any    `json:"result,omitempty"`
}
