// standin-gpu-device-plugin: the gpu-install lab's STAND-IN for NVIDIA's k8s-device-plugin.
//
// It is NOT NVIDIA's device plugin and touches no GPU. It speaks the real kubelet device-plugin
// API (v1beta1) so that a real kubelet on a lab node advertises, schedules and allocates
// `nvidia.com/gpu` (and mixed-strategy `nvidia.com/mig-<profile>`) devices that are described in
// a lab config file (JSON or YAML):
//
//	gpus:
//	- uuid: GPU-513536b6-7d19-9063-b049-1e69664bb298
//	  model: NVIDIA A100-SXM4-80GB
//	  memoryMiB: 81920
//	  migCapable: true
//	  healthy: true            # optional, default true; false -> Unhealthy in ListAndWatch
//	  pciBusId: 00000000:01:00.0   # optional
//	  mig:                     # optional: MIG devices (mixed strategy); the GPU itself is then
//	  - uuid: MIG-...          # not advertised as nvidia.com/gpu
//	    profile: 1g.10gb
//	    healthy: true
//
// One gRPC endpoint per resource (nvidia-gpu.sock, nvidia-mig-<profile>.sock) in the device-plugin
// directory, each registered with the kubelet's Registration service (kubelet.sock). The config
// file is polled: edits (health, devices) reach the kubelet through ListAndWatch. When kubelet.sock
// is re-created (kubelet restart), the endpoints are re-created and registered again.
//
// Allocate answers NVIDIA_VISIBLE_DEVICES=<UUIDs> and mounts the stand-in nvidia-smi at
// /usr/bin/nvidia-smi plus a per-allocation device-info file (JSON) at
// /run/nvidia-standin/devices.json that the stand-in nvidia-smi reads.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/yaml"
)

const (
	// DeviceInfoContainerPath is where Allocate mounts the per-allocation device-info file.
	DeviceInfoContainerPath = "/run/nvidia-standin/devices.json"
	// SmiContainerPath is where Allocate mounts the stand-in nvidia-smi.
	SmiContainerPath = "/usr/bin/nvidia-smi"
)

// MigDevice is one MIG device of a GPU in the lab config.
type MigDevice struct {
	UUID    string `json:"uuid"`
	Profile string `json:"profile"`
	Healthy *bool  `json:"healthy,omitempty"`
}

// GPU is one GPU in the lab config.
type GPU struct {
	UUID       string      `json:"uuid"`
	Model      string      `json:"model"`
	MemoryMiB  int         `json:"memoryMiB"`
	MigCapable bool        `json:"migCapable"`
	Healthy    *bool       `json:"healthy,omitempty"`
	PciBusID   string      `json:"pciBusId,omitempty"`
	Mig        []MigDevice `json:"mig,omitempty"`
}

// Config is the node's lab GPU config.
type Config struct {
	DriverVersion string `json:"driverVersion,omitempty"`
	CudaVersion   string `json:"cudaVersion,omitempty"`
	GPUs          []GPU  `json:"gpus"`
}

// InfoDevice is one entry of the device-info file that the stand-in nvidia-smi reads.
type InfoDevice struct {
	UUID       string      `json:"uuid"`
	Index      int         `json:"index"`
	Model      string      `json:"model"`
	MemoryMiB  int         `json:"memoryMiB"`
	MigCapable bool        `json:"migCapable"`
	PciBusID   string      `json:"pciBusId"`
	Mig        []MigDevice `json:"mig,omitempty"` // allocated MIG devices of this GPU
}

// DeviceInfo is the per-allocation device-info file.
type DeviceInfo struct {
	StandIn       string       `json:"standIn"`
	Resource      string       `json:"resource"`
	DriverVersion string       `json:"driverVersion"`
	CudaVersion   string       `json:"cudaVersion"`
	Devices       []InfoDevice `json:"devices"`
}

func healthy(p *bool) bool { return p == nil || *p }

func loadConfig(path string) (*Config, []byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var c Config
	if err := yaml.UnmarshalStrict(raw, &c); err != nil {
		return nil, raw, fmt.Errorf("%s: %v", path, err)
	}
	seen := map[string]bool{}
	for i, g := range c.GPUs {
		if !strings.HasPrefix(g.UUID, "GPU-") {
			return nil, raw, fmt.Errorf("%s: gpus[%d].uuid %q does not start with GPU-", path, i, g.UUID)
		}
		if g.Model == "" {
			return nil, raw, fmt.Errorf("%s: gpus[%d].model is empty", path, i)
		}
		if seen[g.UUID] {
			return nil, raw, fmt.Errorf("%s: duplicate uuid %s", path, g.UUID)
		}
		seen[g.UUID] = true
		if len(g.Mig) > 0 && !g.MigCapable {
			return nil, raw, fmt.Errorf("%s: gpus[%d] has MIG devices but migCapable is false", path, i)
		}
		for j, m := range g.Mig {
			if !strings.HasPrefix(m.UUID, "MIG-") || m.Profile == "" {
				return nil, raw, fmt.Errorf("%s: gpus[%d].mig[%d] needs uuid MIG-... and profile", path, i, j)
			}
			if seen[m.UUID] {
				return nil, raw, fmt.Errorf("%s: duplicate uuid %s", path, m.UUID)
			}
			seen[m.UUID] = true
		}
	}
	if c.DriverVersion == "" {
		c.DriverVersion = "535.54.03"
	}
	if c.CudaVersion == "" {
		c.CudaVersion = "12.2"
	}
	return &c, raw, nil
}

// resources maps resource name -> device list (mixed MIG strategy).
func resources(c *Config) map[string][]*pluginapi.Device {
	out := map[string][]*pluginapi.Device{}
	for _, g := range c.GPUs {
		if len(g.Mig) == 0 {
			out["nvidia.com/gpu"] = append(out["nvidia.com/gpu"], dev(g.UUID, healthy(g.Healthy)))
			continue
		}
		for _, m := range g.Mig {
			name := "nvidia.com/mig-" + strings.ReplaceAll(m.Profile, "+", ".")
			out[name] = append(out[name], dev(m.UUID, healthy(g.Healthy) && healthy(m.Healthy)))
		}
	}
	return out
}

func dev(id string, ok bool) *pluginapi.Device {
	h := pluginapi.Healthy
	if !ok {
		h = pluginapi.Unhealthy
	}
	return &pluginapi.Device{ID: id, Health: h}
}

func endpointName(resource string) string {
	return "nvidia-" + strings.TrimPrefix(resource, "nvidia.com/") + ".sock"
}

// plugin is one resource's endpoint.
type plugin struct {
	d        *daemon
	resource string
	server   *grpc.Server
	sock     string

	mu      sync.Mutex
	devices []*pluginapi.Device
	watch   map[chan []*pluginapi.Device]bool
}

func (p *plugin) setDevices(devs []*pluginapi.Device) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if summary(devs) == summary(p.devices) {
		return // unchanged: nothing to tell the kubelet
	}
	p.devices = devs
	for ch := range p.watch {
		select {
		case ch <- devs:
		default: // a slow reader gets the newest list on its next receive
			select {
			case <-ch:
			default:
			}
			ch <- devs
		}
	}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	ch := make(chan []*pluginapi.Device, 1)
	p.mu.Lock()
	ch <- p.devices
	p.watch[ch] = true
	p.mu.Unlock()
	defer func() { p.mu.Lock(); delete(p.watch, ch); p.mu.Unlock() }()
	for {
		select {
		case devs := <-ch:
			if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
			log.Printf("STAND-IN %s: ListAndWatch sent %s", p.resource, summary(devs))
		case <-s.Context().Done():
			return nil
		}
	}
}

func summary(devs []*pluginapi.Device) string {
	parts := make([]string, 0, len(devs))
	for _, d := range devs {
		parts = append(parts, d.ID+"="+d.Health)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, creq := range req.ContainerRequests {
		cresp, err := p.d.allocate(p.resource, creq.DevicesIDs)
		if err != nil {
			log.Printf("STAND-IN %s: Allocate %v refused: %v", p.resource, creq.DevicesIDs, err)
			return nil, err
		}
		log.Printf("STAND-IN %s: Allocate %v -> %s", p.resource, creq.DevicesIDs, cresp.Envs["NVIDIA_VISIBLE_DEVICES"])
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

type daemon struct {
	dir, configPath, smiPath, stateDir string

	mu      sync.Mutex
	cfg     *Config
	raw     []byte
	plugins map[string]*plugin
}

func (d *daemon) allocate(resource string, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	d.mu.Lock()
	cfg := d.cfg
	d.mu.Unlock()
	info := DeviceInfo{StandIn: "gpu-install lab STAND-IN device plugin (no real GPU)", Resource: resource,
		DriverVersion: cfg.DriverVersion, CudaVersion: cfg.CudaVersion}
	offered := map[string]bool{}
	for _, dv := range resources(cfg)[resource] {
		offered[dv.ID] = true
	}
	want := map[string]bool{}
	for _, id := range ids {
		if !offered[id] {
			return nil, fmt.Errorf("unknown device %s for %s", id, resource)
		}
		want[id] = true
	}
	found := 0
	for i, g := range cfg.GPUs {
		bus := g.PciBusID
		if bus == "" {
			bus = fmt.Sprintf("00000000:%02X:00.0", i+1)
		}
		entry := InfoDevice{UUID: g.UUID, Index: i, Model: g.Model, MemoryMiB: g.MemoryMiB, MigCapable: g.MigCapable, PciBusID: bus}
		if want[g.UUID] && len(g.Mig) == 0 {
			found++
			info.Devices = append(info.Devices, entry)
			continue
		}
		for _, m := range g.Mig {
			if want[m.UUID] {
				found++
				entry.Mig = append(entry.Mig, m)
			}
		}
		if len(entry.Mig) > 0 {
			info.Devices = append(info.Devices, entry)
		}
	}
	if found != len(want) {
		return nil, fmt.Errorf("unknown device in %v for %s", ids, resource)
	}
	sorted := append([]string(nil), ids...)
	sort.Strings(sorted)
	sum := sha256.Sum256([]byte(resource + "\n" + strings.Join(sorted, ",")))
	body, _ := json.MarshalIndent(info, "", "  ")
	allocDir := filepath.Join(d.stateDir, "allocations")
	if err := os.MkdirAll(allocDir, 0o755); err != nil {
		return nil, err
	}
	file := filepath.Join(allocDir, hex.EncodeToString(sum[:8])+".json")
	if err := writeAtomic(file, append(body, '\n')); err != nil {
		return nil, err
	}
	// Visible devices in config order (what nvidia-smi would enumerate).
	var visible []string
	for _, dv := range info.Devices {
		if len(dv.Mig) == 0 {
			visible = append(visible, dv.UUID)
		}
		for _, m := range dv.Mig {
			visible = append(visible, m.UUID)
		}
	}
	return &pluginapi.ContainerAllocateResponse{
		Envs: map[string]string{
			"NVIDIA_VISIBLE_DEVICES":     strings.Join(visible, ","),
			"NVIDIA_STANDIN_DEVICE_INFO": DeviceInfoContainerPath,
		},
		Mounts: []*pluginapi.Mount{
			{ContainerPath: SmiContainerPath, HostPath: d.smiPath, ReadOnly: true},
			{ContainerPath: DeviceInfoContainerPath, HostPath: file, ReadOnly: true},
		},
		Annotations: map[string]string{"lab.gpu-install/device-plugin": "stand-in"},
	}, nil
}

func writeAtomic(path string, body []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, body, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (d *daemon) startPlugin(resource string, devs []*pluginapi.Device) (*plugin, error) {
	p := &plugin{d: d, resource: resource, devices: devs, watch: map[chan []*pluginapi.Device]bool{},
		sock: filepath.Join(d.dir, endpointName(resource))}
	_ = os.Remove(p.sock)
	l, err := net.Listen("unix", p.sock)
	if err != nil {
		return nil, err
	}
	p.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go func() { _ = p.server.Serve(l) }()
	return p, nil
}

func (d *daemon) register(p *plugin) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, filepath.Join(d.dir, "kubelet.sock"), grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	if err != nil {
		return fmt.Errorf("dial kubelet.sock: %v", err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(p.sock), ResourceName: p.resource,
		Options: &pluginapi.DevicePluginOptions{}})
	if err != nil {
		return fmt.Errorf("register %s: %v", p.resource, err)
	}
	log.Printf("STAND-IN %s: registered endpoint %s with kubelet", p.resource, filepath.Base(p.sock))
	return nil
}

func (d *daemon) stopAll() {
	for name, p := range d.plugins {
		p.server.Stop()
		_ = os.Remove(p.sock)
		delete(d.plugins, name)
	}
}

// sync brings the endpoints in line with the config; registerAll re-registers every endpoint.
func (d *daemon) sync(registerAll bool) error {
	want := resources(d.cfg)
	for name, devs := range want {
		p, ok := d.plugins[name]
		if !ok {
			np, err := d.startPlugin(name, devs)
			if err != nil {
				return err
			}
			d.plugins[name] = np
			if !registerAll {
				if err := d.register(np); err != nil {
					return err
				}
			}
			continue
		}
		p.setDevices(devs)
	}
	for name, p := range d.plugins {
		if _, ok := want[name]; !ok {
			p.setDevices(nil) // the kubelet sees the resource drop to 0
		}
	}
	if registerAll {
		names := make([]string, 0, len(d.plugins))
		for n := range d.plugins {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if err := d.register(d.plugins[n]); err != nil {
				return err
			}
		}
	}
	return nil
}

// identity of kubelet.sock: inode and change time (an inode number alone can be reused at once).
func identity(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf("%d:%d.%09d", st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
	}
	return fi.ModTime().String()
}

// socketsGone: a restarting kubelet removes every socket in the device-plugin dir.
func (d *daemon) socketsGone() bool {
	for _, p := range d.plugins {
		if _, err := os.Stat(p.sock); err != nil {
			return true
		}
	}
	return false
}

func main() {
	log.SetPrefix("standin-gpu-device-plugin: ")
	dir := flag.String("device-plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin socket directory")
	config := flag.String("config", "/etc/gpu-install-lab/gpus.yaml", "the node's lab GPU config (JSON or YAML)")
	smi := flag.String("nvidia-smi", "/usr/local/lib/gpu-install-lab/standin-nvidia-smi", "host path of the stand-in nvidia-smi to mount into containers")
	state := flag.String("state-dir", "/var/lib/gpu-install-lab/device-plugin", "where per-allocation device-info files are written")
	poll := flag.Duration("poll", time.Second, "how often the config file and kubelet.sock are checked")
	flag.Parse()
	log.Printf("STAND-IN for NVIDIA's device plugin (lab only, no real GPU): config %s, socket dir %s", *config, *dir)

	d := &daemon{dir: *dir, configPath: *config, smiPath: *smi, stateDir: *state, plugins: map[string]*plugin{}}
	cfg, raw, err := loadConfig(*config)
	if err != nil {
		log.Fatalf("STAND-IN: %v", err)
	}
	d.cfg, d.raw = cfg, raw
	// SIGTERM/SIGINT: stop serving and remove our sockets, so the kubelet sees the endpoints go.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	var mainMu sync.Mutex // held while the loop below changes the endpoints
	go func() {
		sig := <-stop
		mainMu.Lock()
		d.stopAll()
		log.Printf("STAND-IN: %v: endpoints removed, exiting", sig)
		os.Exit(0)
	}()
	kubeletSock := filepath.Join(*dir, "kubelet.sock")
	var kubeletID string
	registered := false
	for ; ; mainMu.Unlock() {
		time.Sleep(*poll)
		mainMu.Lock()
		id := identity(kubeletSock)
		if id == "" {
			continue // no kubelet (yet): wait for its socket
		}
		if !registered || id != kubeletID || d.socketsGone() {
			if registered {
				log.Printf("STAND-IN: kubelet.sock re-created or plugin sockets removed (kubelet restart): registering again")
			}
			d.stopAll()
			kubeletID = id
			if err := d.sync(true); err != nil {
				log.Printf("STAND-IN: %v (retrying)", err)
				registered = false
				continue
			}
			registered = true
		}
		raw, err := os.ReadFile(*config)
		if err != nil || string(raw) == string(d.raw) {
			continue
		}
		cfg, _, err := loadConfig(*config)
		d.raw = raw
		if err != nil {
			log.Printf("STAND-IN: config change ignored: %v", err)
			continue
		}
		log.Printf("STAND-IN: config %s changed", *config)
		d.mu.Lock()
		d.cfg = cfg
		d.mu.Unlock()
		if err := d.sync(false); err != nil {
			log.Printf("STAND-IN: %v (registering everything again)", err)
			registered = false
		}
	}
}
