package ledger

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"

	bolt "go.etcd.io/bbolt"
)

// Export writes the tables of exportTables, and only those, as one JSON
// object: {"runs":[...],"trials":[...],"events":[...],"selftests":[...],
// "builds":[...],"timed_runs":[...]}, one record a line, from one read
// transaction so the export is a consistent snapshot. The hidden results
// are not in the allow-list and cannot be; trials carry token hashes only.
func (l *Ledger) Export(w io.Writer) error {
	bw := bufio.NewWriter(w)
	err := l.view("export", func(tx *bolt.Tx) error {
		bw.WriteString("{")
		for i, t := range exportTables {
			if i > 0 {
				bw.WriteString(",")
			}
			name, _ := json.Marshal(t.name)
			fmt.Fprintf(bw, "\n%s: [", name)
			n := 0
			err := tx.Bucket(t.bucket).ForEach(func(k, v []byte) error {
				if v == nil {
					return nil
				}
				// Stored values are the JSON this package wrote; check
				// anyway, so a damaged record fails the export instead
				// of yielding broken JSON.
				if !json.Valid(v) {
					return fmt.Errorf("%s %q: stored record is not JSON", t.bucket, k)
				}
				if n > 0 {
					bw.WriteString(",")
				}
				bw.WriteString("\n  ")
				bw.Write(v)
				n++
				return nil
			})
			if err != nil {
				return err
			}
			if n > 0 {
				bw.WriteString("\n")
			}
			bw.WriteString("]")
		}
		bw.WriteString("\n}\n")
		return nil
	})
	if err != nil {
		return err
	}
	return l.wrap("export: write", bw.Flush())
}
