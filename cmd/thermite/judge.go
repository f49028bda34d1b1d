package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"thermite/controller"
	"thermite/controller/kit"
	"thermite/controller/ledger"
	"thermite/internal/config"
	"thermite/internal/copytree"
	"thermite/internal/termsafe"
)

// kitCmd is `thermite kit`.
func kitCmd() *cobra.Command {
	c := &cobra.Command{Use: "kit", Short: "Kits: how to build, run and check a project"}
	c.AddCommand(kitImportCmd())
	return c
}

// kitImportCmd is `thermite kit import`: the kit checked, copied root's
// and read-only beside the others, checked again, then put in place.
func kitImportCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "import DIR",
		Short: "Check a kit's manifest and copy the kit into the controller's folder, which no role can open (root)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, t, err := rootTable("kit import")
			if err != nil {
				return err
			}
			k, err := kit.Load(args[0])
			if err != nil {
				return err
			}
			ctl := t.Controller()
			kits := filepath.Join(cfg.ControllerDir(), "kits")
			if err := os.MkdirAll(kits, 0o700); err != nil {
				return fmt.Errorf("kit import: %w", err)
			}
			os.Chown(kits, ctl.UID, ctl.GID)
			// The kit is root's, readable by the controller's group and
			// writable by nobody: not even the controller can change a check.
			tmp := filepath.Join(kits, ".import-"+randomHex(6))
			if _, err := copytree.Copy(args[0], tmp, copytree.Options{UID: 0, GID: ctl.GID}); err != nil {
				os.RemoveAll(tmp)
				return fmt.Errorf("kit import: %w", err)
			}
			if err := groupReadOnly(tmp); err != nil {
				os.RemoveAll(tmp)
				return fmt.Errorf("kit import: %w", err)
			}
			// The copy is what the judge will use: check it again.
			if _, err := kit.Load(tmp); err != nil {
				os.RemoveAll(tmp)
				return fmt.Errorf("kit import: the copy: %w", err)
			}
			dst := filepath.Join(kits, k.Name)
			old := ""
			if _, err := os.Lstat(dst); err == nil {
				old = filepath.Join(kits, ".old-"+randomHex(6))
				if err := os.Rename(dst, old); err != nil {
					os.RemoveAll(tmp)
					return fmt.Errorf("kit import: %w", err)
				}
			}
			if err := os.Rename(tmp, dst); err != nil {
				os.RemoveAll(tmp)
				return fmt.Errorf("kit import: %w", err)
			}
			if old != "" {
				os.RemoveAll(old)
			}
			fmt.Printf("kit %s imported: %s\n", k.Name, dst)
			return nil
		},
	}
}

// judgeCmd is `thermite judge`: one function a subcommand.
func judgeCmd() *cobra.Command {
	c := &cobra.Command{Use: "judge", Short: "The judge: builds, the store, timed runs and the kit's check (root)"}
	c.AddCommand(judgeBuildCmd(), judgeTimeCmd(), judgeListCmd(), judgeShowCmd())
	return c
}

// judgeBuildCmd is `thermite judge build`: the project imported as the
// controller's, built under the kit, the build's log shown when it fails.
func judgeBuildCmd() *cobra.Command {
	var kitName, project string
	var asJSON bool
	build := &cobra.Command{
		Use:   "build --kit KIT --project DIR",
		Short: "Build a project under a kit as builder and store its outputs; prints the build id",
		Args:  cobra.NoArgs,
		RunE: askAndPrint[ledger.Build]{
			what:   "judge build",
			asJSON: &asJSON,
			table:  true,
			ask: func(q asked) (ledger.Build, error) {
				var b ledger.Build
				t := q.table
				copyDir, err := importProject(q.cfg, t, project, t.Controller())
				if err != nil {
					return b, err
				}
				defer os.RemoveAll(copyDir)
				if err := ctlJudge(q.cfg, "/v1/judge/builds", controller.BuildRequest{Kit: kitName, Project: copyDir}, "build", &b); err != nil {
					if b.Log != "" {
						// The log is the builder's output: what a project's build
						// script printed, escaped before it reaches the terminal.
						os.Stderr.WriteString(termsafe.Escape(b.Log))
					}
					return b, err
				}
				return b, nil
			},
			show: func(_ asked, b ledger.Build) error {
				fmt.Printf("build %s stored: %d files\n", b.ID, len(b.Manifest))
				return nil
			},
		}.runE,
	}
	build.Flags().StringVar(&kitName, "kit", "", "the kit's name")
	build.Flags().StringVar(&project, "project", "", "the project folder")
	build.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return build
}

// judgeTimeCmd is `thermite judge time`.
func judgeTimeCmd() *cobra.Command {
	var kitName string
	var card int
	var asJSON bool
	timeCmd := &cobra.Command{
		Use:   "time BUILD --kit KIT [--card N]",
		Short: "Time a stored build: check its hashes, run it as the timing user on the judge CPUs, run the kit's check",
		Args:  cobra.ExactArgs(1),
		RunE: askAndPrint[ledger.TimedRun]{
			what:   "judge time",
			asJSON: &asJSON,
			ask: func(q asked) (ledger.TimedRun, error) {
				var tr ledger.TimedRun
				err := ctlJudge(q.cfg, "/v1/judge/runs", controller.TimeRequest{Build: q.args[0], Kit: kitName, Card: card}, "run", &tr)
				return tr, err
			},
			show: func(_ asked, tr ledger.TimedRun) error {
				printRun(tr)
				return nil
			},
		}.runE,
	}
	timeCmd.Flags().StringVar(&kitName, "kit", "", "the kit's name")
	timeCmd.Flags().IntVar(&card, "card", -1, "the card to time on (default: none, or card 0 when the kit asks for one)")
	timeCmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return timeCmd
}

// judgeList is the controller's answer to `thermite judge list`.
type judgeList struct {
	Builds []ledger.Build    `json:"builds"`
	Runs   []ledger.TimedRun `json:"runs"`
}

// judgeListCmd is `thermite judge list`: the builds, then the runs.
func judgeListCmd() *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "Builds and timed runs, with their hashes, times and public scores",
		Args:  cobra.NoArgs,
		RunE: askAndPrint[judgeList]{
			what:   "judge list",
			asJSON: &asJSON,
			ask:    askController[judgeList]("GET", fixedPath("/v1/judge"), nil),
			show: func(_ asked, all judgeList) error {
				w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "BUILD\tKIT\tSTATUS\tFILES\tCREATED")
				for _, b := range all.Builds {
					fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", b.ID, b.Kit, b.Status, len(b.Manifest), b.Created.Format(time.RFC3339))
				}
				fmt.Fprintln(w, "\nRUN\tBUILD\tSTATUS\tMEDIAN\tCV\tSCORE")
				for _, r := range all.Runs {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.2f%%\t%s\n", r.ID, r.Build, r.Status, time.Duration(r.MedianWallNS), r.CVPercent, score(r.PublicScore))
				}
				return w.Flush()
			},
		}.runE,
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

// judgeOne is the controller's answer to `thermite judge show`: a build
// or a timed run.
type judgeOne struct {
	Build *ledger.Build    `json:"build"`
	Run   *ledger.TimedRun `json:"run"`
}

// judgeShowCmd is `thermite judge show`.
func judgeShowCmd() *cobra.Command {
	var asJSON bool
	show := &cobra.Command{
		Use:   "show ID",
		Short: "One build or timed run",
		Args:  cobra.ExactArgs(1),
		RunE: askAndPrint[judgeOne]{
			what:   "judge show",
			asJSON: &asJSON,
			ask:    askController[judgeOne]("GET", func(args []string) string { return "/v1/judge/" + args[0] }, nil),
			show: func(_ asked, one judgeOne) error {
				if one.Run != nil {
					printRun(*one.Run)
					return nil
				}
				b := one.Build
				fmt.Printf("build   %s\nkit     %s\nstatus  %s (exit %d)\nstore   %s\n", b.ID, b.Kit, b.Status, b.ExitCode, b.StorePath)
				for p, h := range b.Manifest {
					fmt.Printf("  %s  %s\n", h, termsafe.Line(p))
				}
				return nil
			},
		}.runE,
	}
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return show
}

// groupReadOnly makes a tree readable by its group and writable by
// nobody: folders 0550, files 0440 (0550 when executable).
func groupReadOnly(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o440)
		if d.IsDir() || info.Mode()&0o100 != 0 {
			mode = 0o550
		}
		return os.Chmod(p, mode)
	})
}

func score(s *float64) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf("%g", *s)
}

func printRun(r ledger.TimedRun) {
	fmt.Printf("run     %s\nbuild   %s\nkit     %s\nstatus  %s\nas      %s on CPUs %s\nmedian  %s (spread %s, cv %.2f%%)\nscore   %s\n",
		r.ID, r.Build, r.Kit, r.Status, r.Role, r.CPUs, time.Duration(r.MedianWallNS), time.Duration(r.SpreadWallNS), r.CVPercent, score(r.PublicScore))
	for i, x := range r.Repeats {
		fmt.Printf("  %2d  wall %s  user %s  sys %s  rss %d KiB  exit %d\n", i+1, time.Duration(x.WallNS), time.Duration(x.UserNS), time.Duration(x.SysNS), x.MaxRSSKB, x.ExitCode)
	}
	if r.Error != "" {
		fmt.Printf("error   %s\n", termsafe.Line(r.Error))
	}
}

// ctlJudge posts a judge request; a 422 answer carries the record (a
// failed build with its log, a refused run) beside the error.
func ctlJudge(cfg config.Config, path string, body any, field string, out any) error {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", "http://controller"+path, bytes.NewReader(b))
	resp, err := ctlClient(cfg).Do(req)
	if err != nil {
		return ctlUnreachable(cfg, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		return json.Unmarshal(raw, out)
	}
	var e map[string]json.RawMessage
	json.Unmarshal(raw, &e)
	if rec, ok := e[field]; ok {
		json.Unmarshal(rec, out)
	}
	var msg string
	if json.Unmarshal(e["error"], &msg) != nil {
		json.Unmarshal(e["detail"], &msg)
	}
	return fmt.Errorf("%s", msg)
}
