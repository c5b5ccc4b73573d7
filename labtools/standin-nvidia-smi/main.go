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
// recorded real layouts (driver 535).
//
//	nvidia-smi -L | nvidia-smi | nvidia-smi -q -x | nvidia-smi --stand-in
package main

import (
	"embed"
	"encoding/json"
	"fmt"
	"os"
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
}

type deviceInfo struct {
	DriverVersion string   `json:"driverVersion"`
	CudaVersion   string   `json:"cudaVersion"`
	Devices       []device `json:"devices"`
}

type recorded struct {
	name, header, gpu, footer string
	model                     string
	migEnabled                bool
}

var (
	reModel = regexp.MustCompile(`<product_name>([^<]*)</product_name>`)
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
		start := strings.Index(s, "\n    <gpu id=")
		end := strings.LastIndex(s, "    </gpu>\n")
		if start < 0 || end < 0 {
			continue
		}
		r := recorded{name: e.Name(), header: s[:start+1], gpu: s[start+1 : end+len("    </gpu>\n")], footer: s[end+len("    </gpu>\n"):]}
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
var reFb = regexp.MustCompile(`(?s)\n        <fb_memory_usage>.*?</fb_memory_usage>`)

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
	b = strings.Replace(b, b[:strings.Index(b, ">")+1], `    <gpu id="`+d.PciBusID+`">`, 1)
	b = tag(b, "product_name", d.Model)
	b = tag(b, "uuid", d.UUID)
	b = tag(b, "minor_number", strconv.Itoa(index))
	b = tag(b, "pci_bus_id", d.PciBusID)
	if parts := strings.Split(d.PciBusID, ":"); len(parts) == 3 {
		b = tag(b, "pci_bus", parts[1])
	}
	if fb := reFb.FindString(b); fb != "" && d.MemoryMiB > 0 {
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
	}
	b = tag(b, "current_mig", mode)
	b = tag(b, "pending_mig", mode)
	migs := "<mig_devices>\n            None\n        </mig_devices>"
	if len(d.Mig) > 0 {
		tmpl := reMigDevice.FindString(r.gpu)
		if tmpl != "" {
			var sb strings.Builder
			sb.WriteString("<mig_devices>")
			for i, m := range d.Mig {
				md := tag(tmpl, "index", strconv.Itoa(i))
				if mib := profileMiB(m.Profile); mib > 0 {
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
		sb.WriteString(renderGPU(pick(all, d), d, i))
	}
	sb.WriteString(first.footer)
	return sb.String()
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

// plain: the table layout of recorded driver-535 `nvidia-smi` output; values from the rendered XML.
func plain(devs []device, info deviceInfo) string {
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
	devs, info := visible()
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
