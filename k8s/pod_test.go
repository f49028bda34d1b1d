// Package k8s holds the Kubernetes Pod manifest; its test keeps the Pod in
// step with compose.yaml, so that the two ways of running the harness give
// it the same capabilities, privileges, volumes and GPUs.
package k8s

import (
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type compose struct {
	Services map[string]struct {
		Image       string   `yaml:"image"`
		CapDrop     []string `yaml:"cap_drop"`
		CapAdd      []string `yaml:"cap_add"`
		SecurityOpt []string `yaml:"security_opt"`
		Init        *bool    `yaml:"init"`
		StopSignal  string   `yaml:"stop_signal"`
		StopGrace   string   `yaml:"stop_grace_period"`
		Volumes     []any    `yaml:"volumes"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		Deploy struct {
			Resources struct {
				Reservations struct {
					Devices []struct {
						Driver       string   `yaml:"driver"`
						Capabilities []string `yaml:"capabilities"`
					} `yaml:"devices"`
				} `yaml:"reservations"`
			} `yaml:"resources"`
		} `yaml:"deploy"`
	} `yaml:"services"`
}

type pod struct {
	Kind string `yaml:"kind"`
	Spec struct {
		ShareProcessNamespace         bool `yaml:"shareProcessNamespace"`
		TerminationGracePeriodSeconds int  `yaml:"terminationGracePeriodSeconds"`
		Containers                    []struct {
			Image           string `yaml:"image"`
			SecurityContext struct {
				Privileged               *bool `yaml:"privileged"`
				AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
				Capabilities             struct {
					Drop []string `yaml:"drop"`
					Add  []string `yaml:"add"`
				} `yaml:"capabilities"`
			} `yaml:"securityContext"`
			VolumeMounts []struct {
				Name      string `yaml:"name"`
				MountPath string `yaml:"mountPath"`
				ReadOnly  bool   `yaml:"readOnly"`
			} `yaml:"volumeMounts"`
			LivenessProbe struct {
				Exec struct {
					Command []string `yaml:"command"`
				} `yaml:"exec"`
			} `yaml:"livenessProbe"`
			Resources struct {
				Limits map[string]any `yaml:"limits"`
			} `yaml:"resources"`
		} `yaml:"containers"`
		Volumes []struct {
			Name     string         `yaml:"name"`
			HostPath map[string]any `yaml:"hostPath"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

func load(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// mount is one volume as both files write it: target, read-only.
type mount struct {
	target string
	ro     bool
}

// composeMounts reads compose's short ("name:/path[:ro]") and long forms.
func composeMounts(t *testing.T, vols []any) []mount {
	var out []mount
	for _, v := range vols {
		switch v := v.(type) {
		case string:
			parts := strings.Split(v, ":")
			out = append(out, mount{parts[1], len(parts) > 2 && parts[2] == "ro"})
		case map[string]any:
			ro, _ := v["read_only"].(bool)
			out = append(out, mount{v["target"].(string), ro})
		default:
			t.Fatalf("compose volume %v: unknown form", v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].target < out[j].target })
	return out
}

// The Pod gives the harness what compose gives it, and nothing more: the
// same image, ALL dropped and the broker's six added, no privilege gain, the
// same folders mounted the same way, the GPUs, the same health command.
func TestPodGivesTheHarnessWhatComposeGives(t *testing.T) {
	var c compose
	load(t, "../compose.yaml", &c)
	var p pod
	load(t, "thermite-pod.yaml", &p)
	h, ok := c.Services["harness"]
	if !ok {
		t.Fatal("compose.yaml has no harness service")
	}
	if p.Kind != "Pod" || len(p.Spec.Containers) != 1 {
		t.Fatalf("k8s/thermite-pod.yaml: kind %q, %d containers; want one Pod with one container", p.Kind, len(p.Spec.Containers))
	}
	k := p.Spec.Containers[0]
	if k.Image != h.Image {
		t.Errorf("image: pod %q, compose %q", k.Image, h.Image)
	}
	sc := k.SecurityContext
	if !slices.Equal(sc.Capabilities.Drop, h.CapDrop) || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("capabilities dropped: pod %v, compose %v; want [ALL]", sc.Capabilities.Drop, h.CapDrop)
	}
	if !slices.Equal(sc.Capabilities.Add, h.CapAdd) {
		t.Errorf("capabilities added: pod %v, compose %v", sc.Capabilities.Add, h.CapAdd)
	}
	if !slices.Contains(h.SecurityOpt, "no-new-privileges:true") || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("no_new_privs: compose security_opt %v, pod allowPrivilegeEscalation %v; want both set", h.SecurityOpt, sc.AllowPrivilegeEscalation)
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("the pod's container is privileged")
	}
	if h.Init == nil || *h.Init || p.Spec.ShareProcessNamespace {
		t.Errorf("the broker must be PID 1: compose init %v, pod shareProcessNamespace %v", h.Init, p.Spec.ShareProcessNamespace)
	}
	if h.StopSignal != "SIGTERM" || h.StopGrace != "30s" || p.Spec.TerminationGracePeriodSeconds != 30 {
		t.Errorf("stop: compose %s after %s, pod %d s", h.StopSignal, h.StopGrace, p.Spec.TerminationGracePeriodSeconds)
	}
	var pm []mount
	for _, m := range k.VolumeMounts {
		pm = append(pm, mount{m.MountPath, m.ReadOnly})
	}
	sort.Slice(pm, func(i, j int) bool { return pm[i].target < pm[j].target })
	if cm := composeMounts(t, h.Volumes); !slices.Equal(pm, cm) {
		t.Errorf("mounts:\n pod     %v\n compose %v", pm, cm)
	}
	// The secrets are a folder the operator made (root 0700), never one the
	// runtime makes: compose's bind with create_host_path false, the pod's
	// hostPath of type Directory.
	for _, v := range p.Spec.Volumes {
		if v.Name == "secrets" && (v.HostPath == nil || v.HostPath["type"] != "Directory") {
			t.Errorf("the secrets volume must be a hostPath of type Directory: %v", v.HostPath)
		}
	}
	if got, want := k.LivenessProbe.Exec.Command, h.Healthcheck.Test[1:]; !slices.Equal(got, want) {
		t.Errorf("health: pod %v, compose %v", got, want)
	}
	devs := h.Deploy.Resources.Reservations.Devices
	_, podGPU := k.Resources.Limits["nvidia.com/gpu"]
	if len(devs) != 1 || devs[0].Driver != "nvidia" || !podGPU {
		t.Errorf("GPUs: compose %+v, pod limits %v; want NVIDIA GPUs in both", devs, k.Resources.Limits)
	}
}
