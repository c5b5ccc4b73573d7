// standin-nvidia-smi: the gpu-install lab's STAND-IN for `nvidia-smi` inside containers that the
// stand-in GPU device plugin allocated devices to. It touches no GPU and loads no driver.
//
// It shows ONLY the allocated devices: those named in NVIDIA_VISIBLE_DEVICES (UUIDs, or "all") that
// the per-allocation device-info file describes (NVIDIA_STANDIN_DEVICE_INFO, default
// /run/nvidia-standin/devices.json, written by the plugin's Allocate). Output is rendered from
// recorded real nvidia-smi documents (embedded at build time from tests/fixtures/nvidia-smi/, see
// the README there): `-q -x` takes the recorded XML of the same model (or of a MIG-capable /
// non-MIG-capable recorded GPU when no recorded document has that model) and substitutes the
// device's UUID, name, bus id, memory and MIG state; `-L` and the plain table follow the
// recorded real layouts (driver 535, and driver 580's wider table when the node's driver is 580
// or later: the real H100/H200 recordings). Documents may be indented with spaces (older
// drivers) or tabs (driver 580).
//
//	nvidia-smi -L | nvidia-smi | nvidia-smi -q -x | nvidia-smi --stand-in
//
// On a lab node (NVIDIA_STANDIN_MIG_STATE set by the node's wrapper) it also plays the MIG mode
// protocol of the real tool, for the mig_mode role: `--query-gpu=index,pci.bus_id,name,
// mig.mode.current,mig.mode.pending --format=csv[,noheader]`, `-i N -mig 0|1`, `-i N -r`
// (--gpu-reset) and `mig -i N -dci|-dgi`. The state file (JSON) keeps each GPU's current and
// pending mode and the boot id it was written under: a pending mode becomes current on a GPU
// reset, or when the node has booted since (another /proc/sys/kernel/random/boot_id). Tests make
// a GPU "in use" by listing its index under "busy": switching its mode then stays pending with
// the real tool's warning and its reset is refused with the real tool's message, as on a GPU a
// process holds open.
//
// An NVSwitch node (device info "nvswitch": true, from the node's gpus.yaml) reports each GPU's NVSwitch fabric in
// `-q -x` as the real tool does on HGX boards: state Completed, status Success while the node's Fabric Manager
// STAND-IN unit runs (it writes the state file NVIDIA_STANDIN_FABRIC_STATE when it starts and removes it when it
// stops: gpu_install_lab/standin_fabric.py), else In Progress / N/A, what NVIDIA's Fabric Manager user guide says a
// GPU shows until Fabric Manager has registered it. Other nodes keep the recorded document's N/A.
package main

import (
	"embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

//go:embed docs/*.xml
var docs embed.FS

type migDevice struct {
	UUID    string `json:"uuid"`
	Profile string `json:"profile"`
}

type device struct {
	UUID       string      `json:"uuid"`
	Index      int         `json:"index"`
	Model      string      `json:"model"`
	MemoryMiB  int         `json:"memoryMiB"`
	MigCapable bool        `json:"migCapable"`
	PciBusID   string      `json:"pciBusId"`
	Mig        []migDevice `json:"mig,omitempty"`
	migMode    string      // from the node's MIG mode state ("" = as the MIG devices say)
}

type deviceInfo struct {
	DriverVersion string   `json:"driverVersion"`
	CudaVersion   string   `json:"cudaVersion"`
	NVSwitch      bool     `json:"nvswitch"`
	Devices       []device `json:"devices"`
}

type recorded struct {
	name, header, gpu, footer string
	model                     string
	migEnabled                bool
}

var (
	reModel    = regexp.MustCompile(`<product_name>([^<]*)</product_name>`)
	reGpuStart = regexp.MustCompile(`\n[ \t]*<gpu id=`)
)

func loadDocs() []recorded {
	entries, _ := docs.ReadDir("docs")
	var out []recorded
	for _, e := range entries {
		raw, err := docs.ReadFile("docs/" + e.Name())
		if err != nil {
			continue
		}
		s := string(raw)
		loc := reGpuStart.FindStringIndex(s)
		end := strings.LastIndex(s, "</gpu>\n")
		if loc == nil || end < 0 {
			continue
		}
		start, stop := loc[0], end+len("</gpu>\n")
		r := recorded{name: e.Name(), header: s[:start+1], gpu: s[start+1 : stop], footer: s[stop:]}
		if m := reModel.FindStringSubmatch(r.gpu); m != nil {
			r.model = m[1]
		}
		r.migEnabled = strings.Contains(r.gpu, "<current_mig>Enabled</current_mig>")
		out = append(out, r)
	}
	return out
}

// pick: the recorded document of the same model; else one whose MIG capability matches.
func pick(all []recorded, d device) recorded {
	for _, r := range all {
		if r.model == d.Model {
			return r
		}
	}
	for _, r := range all {
		if r.migEnabled == d.MigCapable {
			return r
		}
	}
	return all[0]
}

func fail(code int, msg string) {
	fmt.Println(msg)
	os.Exit(code)
}

func visible() ([]device, deviceInfo) {
	path := os.Getenv("NVIDIA_STANDIN_DEVICE_INFO")
	if path == "" {
		path = "/run/nvidia-standin/devices.json"
	}
	var info deviceInfo
	raw, err := os.ReadFile(path)
	if err != nil {
		// What the real tool says when no driver/device is reachable.
		fail(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n")
	}
	if err := json.Unmarshal(raw, &info); err != nil {
		fail(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n")
	}
	env := strings.TrimSpace(os.Getenv("NVIDIA_VISIBLE_DEVICES"))
	want := map[string]bool{}
	all := env == "all"
	for _, id := range strings.Split(env, ",") {
		if id = strings.TrimSpace(id); id != "" {
			want[id] = true
		}
	}
	var out []device
	for _, d := range info.Devices {
		if all || want[d.UUID] {
			out = append(out, d)
			continue
		}
		var migs []migDevice
		for _, m := range d.Mig {
			if want[m.UUID] {
				migs = append(migs, m)
			}
		}
		if len(migs) > 0 {
			d.Mig = migs
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		fail(6, "No devices were found")
	}
	if info.DriverVersion == "" {
		info.DriverVersion = "535.54.03"
	}
	if info.CudaVersion == "" {
		info.CudaVersion = "12.2"
	}
	return out, info
}

func tag(block, name, value string) string {
	re := regexp.MustCompile(`<` + name + `>[^<]*</` + name + `>`)
	done := false
	return re.ReplaceAllStringFunc(block, func(m string) string {
		if done {
			return m
		}
		done = true
		return "<" + name + ">" + value + "</" + name + ">"
	})
}

func field(block, name string) string {
	m := regexp.MustCompile(`<` + name + `>([^<]*)</` + name + `>`).FindStringSubmatch(block)
	if m == nil {
		return "N/A"
	}
	return strings.TrimSpace(m[1])
}

var reMigDevices = regexp.MustCompile(`(?s)<mig_devices>.*?</mig_devices>|<mig_devices\s*/>`)
var reMigDevice = regexp.MustCompile(`(?s)\n\s*<mig_device>.*?</mig_device>`)
var reFb = regexp.MustCompile(`(?s)\n(?:        |\t\t)<fb_memory_usage>.*?</fb_memory_usage>`)

// profileFacts: per model, each MIG profile's memory (MiB) and SMs as the driver's own profile
// table (`nvidia-smi mig -lgip`, GiB x 1024) says, for the models with a recorded table
// (tests/fixtures/nvidia-smi/h100-80gb-hbm3/mig-lgip.txt, h200/mig-lgip.txt; values/mig/lgip.yaml).
var profileFacts = map[string]map[string][2]int{
	"NVIDIA H100 80GB HBM3": {
		"1g.10gb": {9984, 16}, "1g.10gb+me": {9984, 16}, "1g.20gb": {20091, 26}, "2g.20gb": {20091, 32},
		"3g.40gb": {40448, 60}, "4g.40gb": {40448, 64}, "7g.80gb": {81152, 132},
	},
	"NVIDIA H200": {
		"1g.18gb": {16384, 16}, "1g.18gb+me": {16384, 16}, "1g.35gb": {33280, 26}, "2g.35gb": {33280, 32},
		"3g.71gb": {71424, 60}, "4g.71gb": {71424, 64}, "7g.141gb": {143360, 132},
	},
}

// profileMiB: a MIG profile's memory as nvidia-smi reports it, approximated as 97.5% of the
// profile's nominal size (exact for the recorded A100-SXM4-80GB 1g.20gb: 19968 MiB).
func profileMiB(p string) int {
	m := regexp.MustCompile(`\.(\d+)gb`).FindStringSubmatch(p)
	if m == nil {
		return 0
	}
	gb, _ := strconv.Atoi(m[1])
	return gb * 1024 * 975 / 1000
}

// renderGPU fills a recorded <gpu> block with the device's identity.
func renderGPU(r recorded, d device, index int) string {
	b := r.gpu
	indent := b[:strings.Index(b, "<")]
	b = strings.Replace(b, b[:strings.Index(b, ">")+1], indent+`<gpu id="`+d.PciBusID+`">`, 1)
	b = tag(b, "product_name", d.Model)
	b = tag(b, "uuid", d.UUID)
	b = tag(b, "minor_number", strconv.Itoa(index))
	b = tag(b, "pci_bus_id", d.PciBusID)
	if parts := strings.Split(d.PciBusID, ":"); len(parts) == 3 {
		b = tag(b, "pci_bus", parts[1])
	}
	// the device's memory, unless it is the recorded one (then the recorded free, which real
	// nvidia-smi rounds: total - reserved - used - 1 MiB on the H200)
	if fb := reFb.FindString(b); fb != "" && d.MemoryMiB > 0 && num(field(fb, "total")) != d.MemoryMiB {
		reserved, _ := strconv.Atoi(strings.Fields(field(fb, "reserved") + " 0")[0])
		used, _ := strconv.Atoi(strings.Fields(field(fb, "used") + " 0")[0])
		nfb := tag(fb, "total", fmt.Sprintf("%d MiB", d.MemoryMiB))
		nfb = tag(nfb, "free", fmt.Sprintf("%d MiB", d.MemoryMiB-reserved-used))
		b = strings.Replace(b, fb, nfb, 1)
	}
	mode := "N/A"
	if d.MigCapable {
		mode = "Disabled"
		if len(d.Mig) > 0 {
			mode = "Enabled"
		}
		if d.migMode != "" {
			mode = d.migMode
		}
	}
	b = tag(b, "current_mig", mode)
	b = tag(b, "pending_mig", mode)
	migs := "<mig_devices>\n            None\n        </mig_devices>"
	if orig := reMigDevices.FindString(b); len(d.Mig) == 0 && strings.Contains(orig, "None") {
		migs = orig // the recorded "no MIG devices" block, as the document indents it
	}
	if len(d.Mig) > 0 {
		tmpl := reMigDevice.FindString(r.gpu)
		if tmpl == "" { // a document recorded with MIG off: the layout of a recorded MIG device
			for _, o := range loadDocs() {
				if tmpl = reMigDevice.FindString(o.gpu); tmpl != "" {
					break
				}
			}
		}
		if tmpl != "" {
			var sb strings.Builder
			sb.WriteString("<mig_devices>")
			for i, m := range d.Mig {
				md := tag(tmpl, "index", strconv.Itoa(i))
				mib := profileMiB(m.Profile)
				if f, ok := profileFacts[d.Model][m.Profile]; ok {
					mib = f[0]
					md = tag(md, "multiprocessor_count", strconv.Itoa(f[1]))
				}
				if mib > 0 {
					fb := regexp.MustCompile(`(?s)<fb_memory_usage>.*?</fb_memory_usage>`).FindString(md)
					used, _ := strconv.Atoi(strings.Fields(field(fb, "used") + " 0")[0])
					nfb := tag(fb, "total", fmt.Sprintf("%d MiB", mib))
					nfb = tag(nfb, "free", fmt.Sprintf("%d MiB", mib-used))
					md = strings.Replace(md, fb, nfb, 1)
				}
				sb.WriteString(md)
			}
			sb.WriteString("\n        </mig_devices>")
			migs = sb.String()
		}
	}
	b = reMigDevices.ReplaceAllLiteralString(b, migs)
	return b
}

func queryXML(devs []device, info deviceInfo) string {
	all := loadDocs()
	first := pick(all, devs[0])
	h := first.header
	h = strings.Replace(h, "<nvidia_smi_log>", "<!-- gpu-install lab STAND-IN nvidia-smi: rendered from recorded document "+first.name+"; no real GPU -->\n<nvidia_smi_log>", 1)
	h = tag(h, "timestamp", time.Now().Format("Mon Jan _2 15:04:05 2006"))
	h = tag(h, "driver_version", info.DriverVersion)
	h = tag(h, "cuda_version", info.CudaVersion)
	h = tag(h, "attached_gpus", strconv.Itoa(len(devs)))
	var sb strings.Builder
	sb.WriteString(h)
	for i, d := range devs {
		sb.WriteString(fabric(renderGPU(pick(all, d), d, i), info))
	}
	sb.WriteString(first.footer)
	return sb.String()
}

var reFabric = regexp.MustCompile(`(?s)<fabric>.*?</fabric>`)

// fabric: on an NVSwitch node, the GPU's fabric state and status (see the package comment); elsewhere the block as
// recorded.
func fabric(gpu string, info deviceInfo) string {
	if !info.NVSwitch {
		return gpu
	}
	state, status := "In Progress", "N/A"
	path := os.Getenv("NVIDIA_STANDIN_FABRIC_STATE")
	if path == "" {
		path = "/run/gpu-install-lab/fabric-manager.state"
	}
	if raw, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(raw))) > 0 {
		state, status = "Completed", "Success"
	}
	return reFabric.ReplaceAllStringFunc(gpu, func(b string) string {
		return tag(tag(b, "state", state), "status", status)
	})
}

// list: the layout of recorded `nvidia-smi -L` output (with MIG devices, driver 535).
func list(devs []device) string {
	var sb strings.Builder
	for i, d := range devs {
		fmt.Fprintf(&sb, "GPU %d: %s (UUID: %s)\n", i, d.Model, d.UUID)
		for j, m := range d.Mig {
			fmt.Fprintf(&sb, "  MIG %-12sDevice %2d: (UUID: %s)\n", m.Profile, j, m.UUID)
		}
	}
	return sb.String()
}

func onOff(v string) string {
	if v == "Enabled" {
		return "On"
	}
	return "Off"
}

func num(v string) int {
	f, err := strconv.ParseFloat(strings.Fields(v + " x")[0], 64)
	if err != nil {
		return 0
	}
	return int(f + 0.5)
}

func pct(v string) string {
	if v == "N/A" {
		return "N/A"
	}
	return strings.ReplaceAll(v, " ", "")
}

// wide: whether the driver prints the wider table of driver 580 (the recorded H100/H200 output)
// rather than driver 535's.
func wide(driver string) bool {
	major, err := strconv.Atoi(strings.SplitN(driver, ".", 2)[0])
	return err == nil && major >= 580
}

// plain580: the table layout of the recorded driver-580 output
// (tests/fixtures/nvidia-smi/h100-80gb-hbm3/plain.txt); values from the rendered XML.
func plain580(devs []device, info deviceInfo) string {
	all := loadDocs()
	var sb strings.Builder
	line := "+" + strings.Repeat("-", 89) + "+\n"
	sep := "+-----------------------------------------+------------------------+----------------------+\n"
	sb.WriteString(time.Now().Format("Mon Jan _2 15:04:05 2006") + "       \n")
	sb.WriteString(line)
	fmt.Fprintf(&sb, "| NVIDIA-SMI %-23sDriver Version: %-15sCUDA Version: %-9s|\n", info.DriverVersion, info.DriverVersion, info.CudaVersion)
	sb.WriteString(sep)
	sb.WriteString("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n")
	sb.WriteString("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n")
	sb.WriteString("|                                         |                        |               MIG M. |\n")
	sb.WriteString("|=========================================+========================+======================|\n")
	for i, d := range devs {
		g := renderGPU(pick(all, d), d, i)
		name := d.Model
		if len(name) > 29 {
			name = name[:26] + "..."
		}
		fmt.Fprintf(&sb, "|%4d  %-31s%-4s|   %s %-3s |%21s |\n", i, name, onOff(field(g, "persistence_mode")),
			d.PciBusID, onOff(field(g, "display_active")), eccCell(g))
		fb := reFb.FindString(g)
		power := fmt.Sprintf("%dW / %4dW", num(powerDraw(g)), num(powerLimit(g)))
		mem := fmt.Sprintf("%dMiB / %6dMiB", num(field(fb, "used")), num(field(fb, "total")))
		fmt.Fprintf(&sb, "|%4s  %4s  %4s%24s |%23s |%8s%13s |\n", pct(field(g, "fan_speed")),
			strings.ReplaceAll(field(g, "gpu_temp"), " ", ""), field(g, "performance_state"), power, mem,
			pct(field(g, "gpu_util")), field(g, "compute_mode"))
		fmt.Fprintf(&sb, "|                                         |                        |%21s |\n", field(g, "current_mig"))
		sb.WriteString(sep)
	}
	sb.WriteString("\n")
	sb.WriteString(line)
	sb.WriteString("| Processes:                                                                              |\n")
	sb.WriteString("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |\n")
	sb.WriteString("|        ID   ID                                                               Usage      |\n")
	sb.WriteString("|=========================================================================================|\n")
	sb.WriteString("|  No running processes found                                                             |\n")
	sb.WriteString(line)
	return sb.String()
}

// eccCell: the plain table's "Volatile Uncorr. ECC" (the volatile DRAM uncorrectable count, Off, or N/A).
func eccCell(g string) string {
	switch field(g, "current_ecc") {
	case "Enabled":
		return field(regexp.MustCompile(`(?s)<volatile>.*?</volatile>`).FindString(g), "dram_uncorrectable")
	case "Disabled":
		return "Off"
	}
	return "N/A"
}

// powerDraw / powerLimit: the GPU's power readings (power_draw before driver 535's instant_power_draw).
func powerDraw(g string) string {
	if v := field(g, "power_draw"); v != "N/A" {
		return v
	}
	return field(g, "instant_power_draw")
}

func powerLimit(g string) string {
	if v := field(g, "current_power_limit"); v != "N/A" {
		return v
	}
	return field(g, "power_limit")
}

// plain: the table layout of recorded driver-535 `nvidia-smi` output; values from the rendered XML.
func plain(devs []device, info deviceInfo) string {
	if wide(info.DriverVersion) {
		return plain580(devs, info)
	}
	all := loadDocs()
	var sb strings.Builder
	line := "+---------------------------------------------------------------------------------------+\n"
	sb.WriteString(time.Now().Format("Mon Jan _2 15:04:05 2006") + "       \n")
	sb.WriteString(line)
	fmt.Fprintf(&sb, "| NVIDIA-SMI %-23sDriver Version: %-13sCUDA Version: %-9s|\n", info.DriverVersion, info.DriverVersion, info.CudaVersion)
	sb.WriteString("|-----------------------------------------+----------------------+----------------------+\n")
	sb.WriteString("| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |\n")
	sb.WriteString("| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |\n")
	sb.WriteString("|                                         |                      |               MIG M. |\n")
	sb.WriteString("|=========================================+======================+======================|\n")
	for i, d := range devs {
		g := renderGPU(pick(all, d), d, i)
		ecc := "N/A"
		if field(g, "current_ecc") == "Enabled" {
			ecc = field(regexp.MustCompile(`(?s)<volatile>.*?</volatile>`).FindString(g), "dram_uncorrectable")
		} else if field(g, "current_ecc") == "Disabled" {
			ecc = "Off"
		}
		name := d.Model
		if len(name) > 29 {
			name = name[:26] + "..."
		}
		fmt.Fprintf(&sb, "|%4d  %-31s%-4s| %s %-3s |%21s |\n", i, name, onOff(field(g, "persistence_mode")),
			d.PciBusID, onOff(field(g, "display_active")), ecc)
		fb := reFb.FindString(g)
		draw := field(g, "power_draw")
		limit := field(g, "current_power_limit")
		if limit == "N/A" {
			limit = field(g, "power_limit")
		}
		power := fmt.Sprintf("%dW / %3dW", num(draw), num(limit))
		mem := fmt.Sprintf("%dMiB / %5dMiB", num(field(fb, "used")), num(field(fb, "total")))
		fmt.Fprintf(&sb, "|%4s  %4s  %4s%24s |%21s |%8s%13s |\n", pct(field(g, "fan_speed")),
			strings.ReplaceAll(field(g, "gpu_temp"), " ", ""), field(g, "performance_state"), power, mem,
			pct(field(g, "gpu_util")), field(g, "compute_mode"))
		fmt.Fprintf(&sb, "|                                         |                      |%21s |\n", field(g, "current_mig"))
		sb.WriteString("+-----------------------------------------+----------------------+----------------------+\n")
	}
	sb.WriteString(strings.Repeat(" ", 89) + "\n")
	sb.WriteString(line)
	sb.WriteString("| Processes:                                                                            |\n")
	sb.WriteString("|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |\n")
	sb.WriteString("|        ID   ID                                                             Usage      |\n")
	sb.WriteString("|=======================================================================================|\n")
	sb.WriteString("|  No running processes found                                                           |\n")
	sb.WriteString(line)
	return sb.String()
}

func main() {
	args := os.Args[1:]
	has := func(f ...string) bool {
		for _, a := range args {
			for _, x := range f {
				if a == x {
					return true
				}
			}
		}
		return false
	}
	if has("--stand-in") {
		fmt.Println("gpu-install lab STAND-IN nvidia-smi: no real GPU; renders recorded nvidia-smi documents for the devices the stand-in device plugin allocated")
		return
	}
	if os.Getenv("NVIDIA_STANDIN_MIG_STATE") != "" {
		if manage(args) {
			return
		}
	}
	devs, info := visible()
	if os.Getenv("NVIDIA_STANDIN_MIG_STATE") != "" {
		st := loadMigState(info.Devices)
		for i := range devs {
			if g, ok := st.GPUs[strconv.Itoa(devs[i].Index)]; ok && devs[i].MigCapable {
				devs[i].migMode = g.Current
			}
		}
	}
	switch {
	case has("-L", "--list-gpus"):
		fmt.Print(list(devs))
	case has("-q", "--query") && has("-x", "--xml-format"):
		fmt.Print(queryXML(devs, info))
	case len(args) == 0:
		fmt.Print(plain(devs, info))
	default:
		fmt.Fprintf(os.Stderr, "gpu-install lab STAND-IN nvidia-smi: only -L, -q -x and no arguments are supported (got %s)\n", strings.Join(args, " "))
		os.Exit(2)
	}
}

// ---- MIG mode management on a lab node (NVIDIA_STANDIN_MIG_STATE) ----

type migGPU struct {
	Current string `json:"current"`
	Pending string `json:"pending"`
}

type migState struct {
	BootID string            `json:"bootId"`
	GPUs   map[string]migGPU `json:"gpus"`
	Busy   []int             `json:"busy,omitempty"`
}

func bootID() string {
	raw, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(raw))
}

// loadMigState: the saved state (pending modes applied when the node booted since), or the
// initial one: MIG-capable GPUs Enabled when they have MIG devices configured, else Disabled.
func loadMigState(devs []device) migState {
	var st migState
	raw, err := os.ReadFile(os.Getenv("NVIDIA_STANDIN_MIG_STATE"))
	if err == nil && json.Unmarshal(raw, &st) == nil && st.GPUs != nil {
		if st.BootID != bootID() {
			for k, g := range st.GPUs {
				g.Current = g.Pending
				st.GPUs[k] = g
			}
			st.BootID = bootID()
		}
		return st
	}
	st = migState{BootID: bootID(), GPUs: map[string]migGPU{}}
	for _, d := range devs {
		if !d.MigCapable {
			continue
		}
		m := "Disabled"
		if len(d.Mig) > 0 {
			m = "Enabled"
		}
		st.GPUs[strconv.Itoa(d.Index)] = migGPU{Current: m, Pending: m}
	}
	return st
}

func saveMigState(st migState) {
	path := os.Getenv("NVIDIA_STANDIN_MIG_STATE")
	raw, _ := json.MarshalIndent(st, "", "  ")
	_ = os.MkdirAll(filepath.Dir(path), 0o755)
	tmp := path + ".tmp"
	if os.WriteFile(tmp, append(raw, '\n'), 0o644) == nil {
		_ = os.Rename(tmp, path)
	}
}

func (st migState) busy(i int) bool {
	for _, b := range st.Busy {
		if b == i {
			return true
		}
	}
	return false
}

func flagValue(args []string, names ...string) (string, bool) {
	for i, a := range args {
		for _, n := range names {
			if a == n && i+1 < len(args) {
				return args[i+1], true
			}
			if strings.HasPrefix(a, n+"=") {
				return strings.TrimPrefix(a, n+"="), true
			}
		}
	}
	return "", false
}

// selected: the devices -i names (indices, comma-separated), all without -i.
func selected(args []string, devs []device) []device {
	v, ok := flagValue(args, "-i", "--id")
	if !ok {
		return devs
	}
	var out []device
	for _, id := range strings.Split(v, ",") {
		found := false
		for _, d := range devs {
			if strconv.Itoa(d.Index) == strings.TrimSpace(id) || d.UUID == strings.TrimSpace(id) || d.PciBusID == strings.TrimSpace(id) {
				out = append(out, d)
				found = true
			}
		}
		if !found {
			fail(6, "No devices were found")
		}
	}
	return out
}

func nodeDevices() []device {
	var info deviceInfo
	raw, err := os.ReadFile(os.Getenv("NVIDIA_STANDIN_DEVICE_INFO"))
	if err != nil || json.Unmarshal(raw, &info) != nil {
		fail(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n")
	}
	return info.Devices
}

// manage handles the MIG mode commands; false: not one of them.
func manage(args []string) bool {
	query, isQuery := flagValue(args, "--query-gpu")
	mig, isMig := flagValue(args, "-mig", "--multi-instance-gpu")
	reset := false
	for _, a := range args {
		if a == "-r" || a == "--gpu-reset" {
			reset = true
		}
	}
	sub := len(args) > 0 && args[0] == "mig"
	if !isQuery && !isMig && !reset && !sub {
		return false
	}
	devs := nodeDevices()
	st := loadMigState(devs)
	sel := selected(args, devs)
	switch {
	case isQuery:
		format, _ := flagValue(args, "--format")
		fields := strings.Split(query, ",")
		if !strings.Contains(format, "noheader") {
			fmt.Println(strings.Join(fields, ", "))
		}
		for _, d := range sel {
			var row []string
			for _, f := range fields {
				g, capable := st.GPUs[strconv.Itoa(d.Index)]
				switch strings.TrimSpace(f) {
				case "index":
					row = append(row, strconv.Itoa(d.Index))
				case "pci.bus_id":
					row = append(row, d.PciBusID)
				case "name":
					row = append(row, d.Model)
				case "uuid":
					row = append(row, d.UUID)
				case "mig.mode.current":
					if capable {
						row = append(row, g.Current)
					} else {
						row = append(row, "[N/A]")
					}
				case "mig.mode.pending":
					if capable {
						row = append(row, g.Pending)
					} else {
						row = append(row, "[N/A]")
					}
				default:
					fmt.Printf("Field \"%s\" is not a valid field to query.\n\n", strings.TrimSpace(f))
					os.Exit(2)
				}
			}
			fmt.Println(strings.Join(row, ", "))
		}
	case isMig:
		want := map[string]string{"1": "Enabled", "0": "Disabled"}[mig]
		if want == "" {
			fail(2, "Invalid MIG mode "+mig)
		}
		verb := map[string]string{"Enabled": "enable", "Disabled": "disable"}[want]
		for _, d := range sel {
			k := strconv.Itoa(d.Index)
			g, capable := st.GPUs[k]
			if !capable {
				fmt.Printf("Unable to %s MIG Mode for GPU %s: Not Supported\nTreating as warning and moving on.\n", verb, d.PciBusID)
				continue
			}
			g.Pending = want
			if st.busy(d.Index) {
				fmt.Printf("Warning: MIG mode is in pending %s state for GPU %s:In use by another client\n", verb, d.PciBusID)
				fmt.Printf("%s is currently being used by one or more other processes (e.g. CUDA application or a monitoring application such as another instance of nvidia-smi). Please first kill all processes using the device and retry the command or reboot the system to make MIG mode effective.\n", d.PciBusID)
			} else {
				g.Current = want
				fmt.Printf("%sd MIG Mode for GPU %s\n", strings.ToUpper(verb[:1])+verb[1:], d.PciBusID)
			}
			st.GPUs[k] = g
		}
		fmt.Println("All done.")
		saveMigState(st)
	case reset:
		if _, ok := flagValue(args, "-i", "--id"); !ok {
			fail(2, "GPU reset requires a GPU: -i <index>")
		}
		code := 0
		for _, d := range sel {
			if st.busy(d.Index) {
				fmt.Printf("Unable to reset GPU %s because it's being used by some other process (e.g. CUDA application, graphics application like X server, monitoring application like other instance of nvidia-smi). Please first kill all processes using this GPU and all compute applications running in the system.\n", d.PciBusID)
				code = 255
				continue
			}
			k := strconv.Itoa(d.Index)
			if g, ok := st.GPUs[k]; ok {
				g.Current = g.Pending
				st.GPUs[k] = g
			}
			fmt.Printf("GPU %s was successfully reset.\n", d.PciBusID)
		}
		saveMigState(st)
		if code == 0 {
			fmt.Println("All done.")
		}
		os.Exit(code)
	case sub:
		for _, d := range sel {
			if g := st.GPUs[strconv.Itoa(d.Index)]; g.Current != "Enabled" {
				fmt.Printf("Unable to destroy instances on GPU %4d: Not Supported (MIG mode is disabled)\n", d.Index)
			} else if len(args) > 1 && (contains(args, "-dci") || contains(args, "-dgi")) {
				fmt.Printf("No %s instances found on GPU %4d\n", map[bool]string{true: "compute", false: "GPU"}[contains(args, "-dci")], d.Index)
			}
		}
	}
	return true
}

func contains(args []string, x string) bool {
	for _, a := range args {
		if a == x {
			return true
		}
	}
	return false
}
