package fence

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestGPUBuild builds what `make gpu` builds (cgo, go-nvml) and checks that
// it links only the C library and the loader, and that NVML without the
// driver's library says "no NVML" cleanly.
func TestGPUBuild(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("needs gcc for the cgo build (make gpu)")
	}
	if _, err := exec.LookPath("ldd"); err != nil {
		t.Skip("needs ldd")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(file))
	bin := filepath.Join(t.TempDir(), "thermite-gpu")
	cmd := exec.Command("make", "-s", "gpu", "GPU_BIN="+bin)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make gpu: %v\n%s", err, out)
	}
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		t.Fatalf("ldd: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		lib := strings.Fields(line)[0]
		switch {
		case strings.HasPrefix(lib, "linux-vdso"), strings.HasPrefix(lib, "libc.so"), strings.Contains(lib, "ld-linux"):
		default:
			t.Errorf("the GPU build links %s; only the C library and the loader are allowed:\n%s", lib, out)
		}
	}
	// No driver here: NVML must say so, and the probe must still run.
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"); err == nil {
		t.Skip("this machine has the NVIDIA driver library; the no-NVML path cannot be checked")
	}
	p := exec.Command(bin, "__probe", "try", "nvml")
	got, err := p.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(got), "ok\n-1 no NVML: ") {
		t.Fatalf("probe nvml without the driver: %v\n%s", err, got)
	}
	t.Logf("%s", strings.TrimSpace(string(got)))
}
