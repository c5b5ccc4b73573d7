// standin-dcgm-exporter: the gpu-install lab's STAND-IN for NVIDIA's dcgm-exporter. It touches no
// GPU and runs no DCGM.
//
// It serves /metrics in dcgm-exporter's text format for the node's STAND-IN GPUs (the lab's
// node-devices.json). The values are those of one recorded GPU (gpu="0" of
// tests/fixtures/dcgm-exporter/node-a.prom, embedded at build time; provenance in the README
// there), relabelled per device: gpu, UUID, device, modelName, pci_bus_id and Hostname. What the
// real exporter decides, this one decides the same way:
//   - which fields: only those listed in the counters CSV it is given (-f, or
//     DCGM_EXPORTER_COLLECTORS), read as dcgm-exporter reads it (comments '#', 3 columns);
//   - per-pod attribution (-k, or DCGM_EXPORTER_KUBERNETES=true): each GPU's series carry
//     pod/namespace/container of the container the kubelet's pod-resources API (v1, List) says
//     holds that device, read at every scrape.
//
//	standin-dcgm-exporter [-f counters.csv] [-a :9400] [-k] [--devices node-devices.json]
package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

//go:embed template.prom
var template string

type device struct {
	UUID     string `json:"uuid"`
	Index    int    `json:"index"`
	Model    string `json:"model"`
	PciBusID string `json:"pciBusId"`
}

type sample struct {
	name   string
	labels [][2]string
	value  string
}

var reSample = regexp.MustCompile(`^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)`)
var reLabel = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// parseTemplate: the HELP/TYPE lines per metric and gpu 0's samples, in file order.
func parseTemplate() (map[string][]string, []sample) {
	meta := map[string][]string{}
	var out []sample
	for _, line := range strings.Split(template, "\n") {
		if strings.HasPrefix(line, "# HELP ") || strings.HasPrefix(line, "# TYPE ") {
			f := strings.Fields(line)
			if len(f) >= 3 {
				meta[f[2]] = append(meta[f[2]], line)
			}
			continue
		}
		m := reSample.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := sample{name: m[1], value: m[4]}
		for _, l := range reLabel.FindAllStringSubmatch(m[3], -1) {
			s.labels = append(s.labels, [2]string{l[1], l[2]})
		}
		if label(s, "gpu") == "0" {
			out = append(out, s)
		}
	}
	return meta, out
}

func label(s sample, k string) string {
	for _, l := range s.labels {
		if l[0] == k {
			return l[1]
		}
	}
	return ""
}

// collectors: the field names of a dcgm-exporter counters CSV.
func collectors(path string) (map[string]bool, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for n, line := range strings.Split(string(raw), "\n") {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 3 {
			return nil, fmt.Errorf("%s line %d: %d fields, need 3", path, n+1, len(f))
		}
		out[strings.TrimSpace(f[0])] = true
	}
	return out, nil
}

type owner struct{ pod, namespace, container string }

// owners: device id -> the container holding it, from the kubelet's pod-resources API.
func owners(sock string) (map[string]owner, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, sock, grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := podresources.NewPodResourcesListerClient(conn).List(ctx, &podresources.ListPodResourcesRequest{})
	if err != nil {
		return nil, err
	}
	out := map[string]owner{}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if !strings.HasPrefix(d.GetResourceName(), "nvidia.com/") {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					out[id] = owner{p.GetName(), p.GetNamespace(), c.GetName()}
				}
			}
		}
	}
	return out, nil
}

func quote(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}

func main() {
	env := func(k, d string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return d
	}
	csv := flag.String("f", env("DCGM_EXPORTER_COLLECTORS", "/etc/dcgm-exporter/default-counters.csv"), "counters CSV")
	addr := flag.String("a", env("DCGM_EXPORTER_LISTEN", ":9400"), "listen address")
	kube := flag.Bool("k", env("DCGM_EXPORTER_KUBERNETES", "false") == "true", "per-pod attribution")
	devices := flag.String("devices", env("NVIDIA_STANDIN_DEVICE_INFO", "/etc/gpu-install-lab/node-devices.json"), "the node's STAND-IN GPUs")
	sock := flag.String("pod-resources", env("DCGM_POD_RESOURCES_KUBELET_SOCKET", "/var/lib/kubelet/pod-resources/kubelet.sock"), "kubelet pod-resources socket")
	flag.Parse()
	fields, err := collectors(*csv)
	if err != nil {
		log.Fatalf("STAND-IN dcgm-exporter: %v", err)
	}
	meta, samples := parseTemplate()
	hostname := env("NODE_NAME", "")
	if hostname == "" {
		hostname, _ = os.Hostname()
	}
	log.Printf("gpu-install lab STAND-IN dcgm-exporter: %d field(s) from %s, attribution %v, on %s", len(fields), *csv, *kube, *addr)
	http.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		var info struct {
			Devices []device `json:"devices"`
		}
		raw, err := os.ReadFile(*devices)
		if err == nil {
			err = json.Unmarshal(raw, &info)
		}
		if err != nil {
			http.Error(w, "STAND-IN dcgm-exporter: no GPU list: "+err.Error(), http.StatusInternalServerError)
			return
		}
		held := map[string]owner{}
		if *kube {
			if held, err = owners(*sock); err != nil {
				log.Printf("pod-resources: %v", err)
				held = map[string]owner{}
			}
		}
		sort.Slice(info.Devices, func(i, j int) bool { return info.Devices[i].Index < info.Devices[j].Index })
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		done := map[string]bool{}
		for _, s := range samples {
			if !fields[s.name] || done[s.name] {
				continue
			}
			done[s.name] = true
			for _, m := range meta[s.name] {
				fmt.Fprintln(w, m)
			}
			for _, d := range info.Devices {
				for _, t := range samples {
					if t.name != s.name {
						continue
					}
					var parts []string
					for _, l := range t.labels {
						v := l[1]
						switch l[0] {
						case "pod", "namespace", "container", "pod_uid":
							continue
						case "gpu":
							v = fmt.Sprint(d.Index)
						case "UUID":
							v = d.UUID
						case "device":
							v = fmt.Sprintf("nvidia%d", d.Index)
						case "modelName":
							v = d.Model
						case "pci_bus_id":
							v = d.PciBusID
						case "Hostname":
							v = hostname
						}
						parts = append(parts, fmt.Sprintf(`%s="%s"`, l[0], quote(v)))
					}
					if o, ok := held[d.UUID]; ok {
						parts = append(parts, fmt.Sprintf(`container="%s"`, quote(o.container)),
							fmt.Sprintf(`namespace="%s"`, quote(o.namespace)), fmt.Sprintf(`pod="%s"`, quote(o.pod)))
					}
					fmt.Fprintf(w, "%s{%s} %s\n", t.name, strings.Join(parts, ","), t.value)
				}
			}
		}
	})
	log.Fatal(http.ListenAndServe(*addr, nil))
}
