//go:build !nvml

package fence

// discoverNVML is not in the static build: it has no cgo, so no NVML.
func discoverNVML(string) ([]Card, string, error) {
	return nil, "no NVML: this is the static build (make gpu builds with NVML)", nil
}

// NVMLUsable is the number of devices NVML reports, or -1 without NVML.
func NVMLUsable() (int, string) { return -1, "no NVML: static build" }
