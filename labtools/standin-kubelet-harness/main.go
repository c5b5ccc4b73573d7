// standin-kubelet-harness: a test-only STAND-IN for the kubelet's side of the device-plugin API
// (v1beta1), used by gpu-install's tests to exercise the stand-in GPU device plugin without a
// kubelet. It serves Registration on <dir>/kubelet.sock; for every Register call it prints a JSON
// line, dials the plugin's endpoint and prints one JSON line per ListAndWatch update. Commands on
// stdin (one per line):
//
//	allocate <resource> <id>[,<id>...]   -> {"event":"allocate",...} (or "allocate-error")
//	options <resource>                   -> {"event":"options",...}
//	prestart <resource>                  -> {"event":"prestart",...}
//
// Output is JSON lines on stdout, one event per line.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

var (
	outMu sync.Mutex
	dir   string

	connMu sync.Mutex
	conns  = map[string]*grpc.ClientConn{} // resource -> plugin connection
)

func emit(v map[string]interface{}) {
	b, _ := json.Marshal(v)
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Println(string(b))
}

type registration struct{}

func (registration) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	emit(map[string]interface{}{"event": "register", "version": r.Version, "endpoint": r.Endpoint,
		"resource": r.ResourceName})
	if r.Version != pluginapi.Version {
		return nil, fmt.Errorf("unsupported version %q", r.Version)
	}
	go watch(r.ResourceName, r.Endpoint)
	return &pluginapi.Empty{}, nil
}

func dial(endpoint string) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return grpc.DialContext(ctx, filepath.Join(dir, endpoint), grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
}

func watch(resource, endpoint string) {
	conn, err := dial(endpoint)
	if err != nil {
		emit(map[string]interface{}{"event": "dial-error", "resource": resource, "error": err.Error()})
		return
	}
	connMu.Lock()
	conns[resource] = conn
	connMu.Unlock()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		emit(map[string]interface{}{"event": "watch-error", "resource": resource, "error": err.Error()})
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			emit(map[string]interface{}{"event": "watch-end", "resource": resource, "error": err.Error()})
			return
		}
		devs := []map[string]string{}
		for _, d := range resp.Devices {
			devs = append(devs, map[string]string{"id": d.ID, "health": d.Health})
		}
		emit(map[string]interface{}{"event": "devices", "resource": resource, "devices": devs})
	}
}

func client(resource string) (pluginapi.DevicePluginClient, error) {
	connMu.Lock()
	defer connMu.Unlock()
	c, ok := conns[resource]
	if !ok {
		return nil, fmt.Errorf("no plugin registered for %s", resource)
	}
	return pluginapi.NewDevicePluginClient(c), nil
}

func command(line string) {
	f := strings.Fields(line)
	if len(f) < 2 {
		emit(map[string]interface{}{"event": "usage-error", "line": line})
		return
	}
	c, err := client(f[1])
	if err != nil {
		emit(map[string]interface{}{"event": f[0] + "-error", "error": err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch f[0] {
	case "allocate":
		if len(f) != 3 {
			emit(map[string]interface{}{"event": "usage-error", "line": line})
			return
		}
		resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIDs: strings.Split(f[2], ",")}}})
		if err != nil {
			emit(map[string]interface{}{"event": "allocate-error", "resource": f[1], "error": err.Error()})
			return
		}
		var crs []interface{}
		for _, cr := range resp.ContainerResponses {
			var mounts []map[string]interface{}
			for _, m := range cr.Mounts {
				mounts = append(mounts, map[string]interface{}{"containerPath": m.ContainerPath, "hostPath": m.HostPath, "readOnly": m.ReadOnly})
			}
			crs = append(crs, map[string]interface{}{"envs": cr.Envs, "mounts": mounts, "annotations": cr.Annotations})
		}
		emit(map[string]interface{}{"event": "allocate", "resource": f[1], "containers": crs})
	case "options":
		o, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
		if err != nil {
			emit(map[string]interface{}{"event": "options-error", "error": err.Error()})
			return
		}
		emit(map[string]interface{}{"event": "options", "resource": f[1], "preStartRequired": o.PreStartRequired})
	case "prestart":
		_, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{})
		ev := map[string]interface{}{"event": "prestart", "resource": f[1], "ok": err == nil}
		if err != nil {
			ev["error"] = err.Error()
		}
		emit(ev)
	default:
		emit(map[string]interface{}{"event": "usage-error", "line": line})
	}
}

func main() {
	log.SetPrefix("standin-kubelet-harness: ")
	flag.StringVar(&dir, "device-plugin-dir", "", "socket directory (kubelet.sock is served there)")
	flag.Parse()
	if dir == "" {
		log.Fatal("--device-plugin-dir is required")
	}
	sock := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(s, registration{})
	go func() { _ = s.Serve(l) }()
	emit(map[string]interface{}{"event": "listening", "socket": sock})
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			command(line)
		}
	}
	s.Stop()
}
