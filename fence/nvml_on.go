//go:build nvml

package fence

import (
	"fmt"
	"path/filepath"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// discoverNVML asks the driver's library for the cards. Without the library
// (no driver here) it says so and discovery falls back to /dev and /proc.
func discoverNVML(devRoot string) ([]Card, string, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, "no NVML: " + nvml.ErrorString(ret), nil
	}
	defer nvml.Shutdown()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, "", fmt.Errorf("fence: nvml: device count: %s", nvml.ErrorString(ret))
	}
	var cards []Card
	for i := 0; i < n; i++ {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, "", fmt.Errorf("fence: nvml: device %d: %s", i, nvml.ErrorString(ret))
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, "", fmt.Errorf("fence: nvml: device %d: UUID: %s", i, nvml.ErrorString(ret))
		}
		minor, ret := dev.GetMinorNumber()
		if ret != nvml.SUCCESS {
			return nil, "", fmt.Errorf("fence: nvml: device %d: minor number: %s", i, nvml.ErrorString(ret))
		}
		pci, _ := dev.GetPciInfo()
		cards = append(cards, Card{Index: i, Minor: minor, UUID: uuid, Path: filepath.Join(devRoot, fmt.Sprintf("nvidia%d", minor)), Bus: busID(pci.BusId)})
	}
	sort.Slice(cards, func(i, j int) bool { return cards[i].Index < cards[j].Index })
	return cards, fmt.Sprintf("nvml: %d devices", n), nil
}

func busID(b [32]int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// NVMLUsable is the number of devices NVML reports to this process (the
// probe calls it as a role: the fence decides what it can open), or -1.
func NVMLUsable() (int, string) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return -1, "no NVML: " + nvml.ErrorString(ret)
	}
	defer nvml.Shutdown()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return -1, "nvml: " + nvml.ErrorString(ret)
	}
	return n, fmt.Sprintf("nvml: %d devices", n)
}
