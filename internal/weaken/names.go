package weaken

// Switches named by more than one package: each turns one of issue 12's
// protections off in a thermite_weaken build, for the self-test's
// breakage tests.
const (
	// SysVIPC drops the filter's SysV IPC rules and the stop helper's
	// removal of a stopped user's IPC objects.
	SysVIPC = "sysv-ipc"
	// SetID answers openat2 again in every role command, and lets the
	// sweep and the hand-back skip a role's hard-linked set-id files.
	SetID = "setid"
	// RunFolder0711 leaves a timed run's folder as it was before issue 12:
	// the controller's, 0711, reachable by whoever knows its path.
	RunFolder0711 = "run-folder-0711"
	// LandlockABIPrefix, followed by a number, pretends the kernel has that
	// Landlock ABI (when lower than its own).
	LandlockABIPrefix = "landlock-abi-"
)
