// standin-gpu-operator: the gpu-install lab's STAND-IN for the NVIDIA GPU Operator's controller.
//
// It is NOT NVIDIA's operator: it installs no driver, no toolkit and runs no NVIDIA code. The
// operator's own pods cannot run offline on the lab (no GPU, no NVML, no driver containers), so
// this program plays, through the real API server and with the service account the chart gives
// it, the parts of the operator that `gpu-install validate` reads:
//
//   - the device plugin DaemonSet `nvidia-device-plugin-daemonset` in the operator's namespace,
//     with the image and pull secrets of the ClusterPolicy's spec.devicePlugin (as the operator
//     deploys it), owned by the ClusterPolicy (deleted with it). Its pods do not register
//     devices themselves: each one is Ready when its node's device-plugin directory holds a
//     registered nvidia-*.sock endpoint (the lab's STAND-IN device plugin, a systemd unit of
//     the node, advertises the GPUs);
//   - ClusterPolicy status.state: `ready` once that DaemonSet has a Ready pod on every node it
//     is scheduled to, else `notReady` (with a Ready condition saying why); policies beyond
//     the oldest one are `ignored`, as the operator does;
//   - mig-manager's verdict: a node labelled nvidia.com/mig.config=all-disabled gets
//     nvidia.com/mig.config.state=success (the lab's GPUs have MIG off: nothing to change);
//     any other layout gets `failed` (this stand-in carves no MIG devices).
//
// Every log line says STAND-IN.
//
//	standin-gpu-operator [--apiserver URL] [--namespace NS] [--interval 2s] [--once]
//
// The API server: --apiserver, else $GPU_OPERATOR_STANDIN_APISERVER, else
// https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT. Credentials: the pod's service
// account token and CA (/var/run/secrets/kubernetes.io/serviceaccount/).
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

const (
	saDir        = "/var/run/secrets/kubernetes.io/serviceaccount"
	dsName       = "nvidia-device-plugin-daemonset"
	dsApp        = "nvidia-device-plugin-daemonset"
	pluginDir    = "/var/lib/kubelet/device-plugins"
	migConfig    = "nvidia.com/mig.config"
	migState     = "nvidia.com/mig.config.state"
	standinLabel = "gpu-install.lab/stand-in"
	cpPath       = "/apis/nvidia.com/v1/clusterpolicies"
)

// the device plugin pod's script: it says what it is and holds its place (ending at once on SIGTERM, as the real
// plugin does: a bare `exec sleep` as the container's first process ignored it); its readiness probe
// (probeScript) looks for the node's registered device-plugin endpoints
const podScript = `echo "STAND-IN nvidia-device-plugin pod (gpu-install lab): NVIDIA's device plugin needs NVML and a GPU;` +
	` the GPUs of node $NODE_NAME are advertised by the lab's STAND-IN device plugin (gpu-install-lab-device-plugin.service)"
for s in ` + pluginDir + `/nvidia-*.sock; do [ -S "$s" ] && echo "registered endpoint: $s"; done
trap 'exit 0' TERM INT; sleep 2147483647 & wait`

const probeScript = `for s in ` + pluginDir + `/nvidia-*.sock; do [ -S "$s" ] && exit 0; done; exit 1`

type client struct {
	base  string
	http  *http.Client
	token string
}

type apiError struct {
	code int
	body string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("HTTP %d: %s", e.code, strings.TrimSpace(e.body))
}

func notFound(err error) bool {
	var a *apiError
	return errors.As(err, &a) && a.code == http.StatusNotFound
}

func newClient(base string) (*client, error) {
	ca, err := os.ReadFile(filepath.Join(saDir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s/ca.crt: no certificate", saDir)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	return &client{base: strings.TrimRight(base, "/"), http: &http.Client{Transport: tr, Timeout: 20 * time.Second}}, nil
}

func (c *client) do(method, path, ctype string, body interface{}, out interface{}) error {
	token, err := os.ReadFile(filepath.Join(saDir, "token")) // re-read: the kubelet may rotate it
	if err != nil {
		return err
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &apiError{resp.StatusCode, string(data)}
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

type obj = map[string]interface{}

func str(m obj, keys ...string) string {
	var cur interface{} = m
	for _, k := range keys {
		mm, ok := cur.(map[string]interface{})
		if !ok {
			return ""
		}
		cur = mm[k]
	}
	s, _ := cur.(string)
	return s
}

func sub(m obj, key string) obj {
	if v, ok := m[key].(map[string]interface{}); ok {
		return v
	}
	return obj{}
}

func num(m obj, key string) int64 {
	if v, ok := m[key].(float64); ok {
		return int64(v)
	}
	return 0
}

// componentImage: a component's image as the ClusterPolicy gives it: either one reference in
// `image` (the fixture chart's ClusterPolicy) or repository/image/version (NVIDIA's chart's).
func componentImage(c obj) string {
	repo, image, version := str(c, "repository"), str(c, "image"), str(c, "version")
	if repo == "" {
		return image
	}
	ref := repo
	if image != "" {
		ref += "/" + image
	}
	if strings.HasPrefix(version, "sha256:") {
		return ref + "@" + version
	}
	if version != "" {
		return ref + ":" + version
	}
	return ref
}

func pullSecrets(c obj) []obj {
	out := []obj{}
	list, _ := c["imagePullSecrets"].([]interface{})
	for _, s := range list {
		switch v := s.(type) {
		case string:
			out = append(out, obj{"name": v})
		case map[string]interface{}:
			if n, _ := v["name"].(string); n != "" {
				out = append(out, obj{"name": n})
			}
		}
	}
	return out
}

func enabled(c obj) bool {
	v, ok := c["enabled"].(bool)
	return !ok || v
}

func daemonSet(ns string, cp obj, image string, secrets []obj) obj {
	meta := sub(cp, "metadata")
	labels := obj{"app": dsApp, standinLabel: "true"}
	return obj{
		"apiVersion": "apps/v1", "kind": "DaemonSet",
		"metadata": obj{"name": dsName, "namespace": ns, "labels": labels,
			"ownerReferences": []obj{{"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
				"name": str(meta, "name"), "uid": str(meta, "uid"), "controller": true}}},
		"spec": obj{
			"selector": obj{"matchLabels": obj{"app": dsApp}},
			"template": obj{
				"metadata": obj{"labels": labels},
				"spec": obj{
					"tolerations":                   []obj{{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}},
					"imagePullSecrets":              secrets,
					"automountServiceAccountToken":  false,
					"terminationGracePeriodSeconds": 1,
					"containers": []obj{{
						"name": "nvidia-device-plugin", "image": image,
						"command": []string{"sh", "-c", podScript},
						"env":     []obj{{"name": "NODE_NAME", "valueFrom": obj{"fieldRef": obj{"fieldPath": "spec.nodeName"}}}},
						"readinessProbe": obj{"exec": obj{"command": []string{"sh", "-c", probeScript}},
							"periodSeconds": 2, "failureThreshold": 1},
						"volumeMounts": []obj{{"name": "device-plugin", "mountPath": pluginDir, "readOnly": true}},
					}},
					"volumes": []obj{{"name": "device-plugin", "hostPath": obj{"path": pluginDir}}},
				},
			},
		},
	}
}

// podSpecOf: (image, pull secret names) of a DaemonSet's first container
func podSpecOf(ds obj) (string, string) {
	spec := sub(sub(sub(ds, "spec"), "template"), "spec")
	image := ""
	if cs, ok := spec["containers"].([]interface{}); ok && len(cs) > 0 {
		if c, ok := cs[0].(map[string]interface{}); ok {
			image, _ = c["image"].(string)
		}
	}
	names := []string{}
	for _, s := range pullSecrets(obj{"imagePullSecrets": spec["imagePullSecrets"]}) {
		names = append(names, s["name"].(string))
	}
	return image, strings.Join(names, ",")
}

type operator struct {
	c     *client
	ns    string
	state map[string]string // last state written per ClusterPolicy
}

// reconcileDevicePlugin: the DaemonSet as the ClusterPolicy asks; returns (ready, why)
func (o *operator) reconcileDevicePlugin(cp obj) (bool, string) {
	spec := sub(cp, "spec")
	dp := sub(spec, "devicePlugin")
	path := fmt.Sprintf("/apis/apps/v1/namespaces/%s/daemonsets/%s", o.ns, dsName)
	if !enabled(dp) {
		if err := o.c.do("DELETE", path, "", nil, nil); err != nil && !notFound(err) {
			return false, "devicePlugin disabled; deleting " + dsName + ": " + err.Error()
		}
		return true, "devicePlugin disabled in the ClusterPolicy"
	}
	image := componentImage(dp)
	if image == "" {
		return false, "spec.devicePlugin names no image"
	}
	secrets := pullSecrets(dp)
	want := daemonSet(o.ns, cp, image, secrets)
	names := []string{}
	for _, s := range secrets {
		names = append(names, s["name"].(string))
	}
	wantImage, wantSecrets := image, strings.Join(names, ",")
	var have obj
	err := o.c.do("GET", path, "", nil, &have)
	if err == nil {
		if img, sec := podSpecOf(have); img != wantImage || sec != wantSecrets {
			log.Printf("STAND-IN gpu-operator: %s/%s has image %s, the ClusterPolicy asks %s: replacing it", o.ns, dsName, img, wantImage)
			if err := o.c.do("DELETE", path, "", nil, nil); err != nil && !notFound(err) {
				return false, "replacing " + dsName + ": " + err.Error()
			}
			return false, dsName + " being replaced"
		}
	} else if notFound(err) {
		log.Printf("STAND-IN gpu-operator: creating DaemonSet %s/%s (image %s)", o.ns, dsName, image)
		if err := o.c.do("POST", fmt.Sprintf("/apis/apps/v1/namespaces/%s/daemonsets", o.ns), "application/json", want, nil); err != nil {
			return false, "creating " + dsName + ": " + err.Error()
		}
		return false, dsName + " created"
	} else {
		return false, "reading " + dsName + ": " + err.Error()
	}
	st := sub(have, "status")
	desired, ready, updated := num(st, "desiredNumberScheduled"), num(st, "numberReady"), num(st, "updatedNumberScheduled")
	gen, seen := num(sub(have, "metadata"), "generation"), num(st, "observedGeneration")
	why := fmt.Sprintf("%s: %d of %d pods ready", dsName, ready, desired)
	return desired > 0 && ready == desired && updated == desired && seen >= gen, why
}

func (o *operator) setState(cp obj, state, reason, message string) {
	name := str(sub(cp, "metadata"), "name")
	key := state + "\x00" + message
	if o.state[name] == key && str(sub(cp, "status"), "state") == state {
		return
	}
	status := "False"
	if state == "ready" {
		status = "True"
	}
	now := time.Now().UTC().Format(time.RFC3339)
	patch := obj{"status": obj{"state": state, "namespace": o.ns, "conditions": []obj{
		{"type": "Ready", "status": status, "reason": reason, "message": message, "lastTransitionTime": now},
	}}}
	if err := o.c.do("PATCH", cpPath+"/"+name+"/status", "application/merge-patch+json", patch, nil); err != nil {
		log.Printf("STAND-IN gpu-operator: ClusterPolicy %s: patching status: %v", name, err)
		return
	}
	o.state[name] = key
	log.Printf("STAND-IN gpu-operator: ClusterPolicy %s: state %s (%s)", name, state, message)
}

// reconcileMig: mig-manager's verdict label for every node that has a layout label
func (o *operator) reconcileMig(cp obj) {
	if !enabled(sub(sub(cp, "spec"), "migManager")) {
		return
	}
	var nodes struct {
		Items []obj `json:"items"`
	}
	if err := o.c.do("GET", "/api/v1/nodes?labelSelector="+migConfig, "", nil, &nodes); err != nil {
		log.Printf("STAND-IN gpu-operator: listing nodes: %v", err)
		return
	}
	for _, n := range nodes.Items {
		meta := sub(n, "metadata")
		name, labels := str(meta, "name"), sub(meta, "labels")
		layout, _ := labels[migConfig].(string)
		want := "failed"
		if layout == "all-disabled" {
			want = "success"
		}
		if have, _ := labels[migState].(string); have == want {
			continue
		}
		patch := obj{"metadata": obj{"labels": obj{migState: want}}}
		if err := o.c.do("PATCH", "/api/v1/nodes/"+name, "application/merge-patch+json", patch, nil); err != nil {
			log.Printf("STAND-IN gpu-operator: node %s: labelling %s=%s: %v", name, migState, want, err)
			continue
		}
		if want == "success" {
			log.Printf("STAND-IN gpu-operator (mig-manager): node %s: %s=all-disabled, MIG off: %s=success", name, migConfig, migState)
		} else {
			log.Printf("STAND-IN gpu-operator (mig-manager): node %s: %s=%s: this STAND-IN carves no MIG devices: %s=failed", name, migConfig, layout, migState)
		}
	}
}

func (o *operator) reconcile() error {
	var list struct {
		Items []obj `json:"items"`
	}
	if err := o.c.do("GET", cpPath, "", nil, &list); err != nil {
		return fmt.Errorf("listing ClusterPolicies: %w", err)
	}
	if len(list.Items) == 0 {
		log.Printf("STAND-IN gpu-operator: no ClusterPolicy yet")
		return nil
	}
	sort.SliceStable(list.Items, func(i, j int) bool {
		a, b := sub(list.Items[i], "metadata"), sub(list.Items[j], "metadata")
		return str(a, "creationTimestamp")+str(a, "name") < str(b, "creationTimestamp")+str(b, "name")
	})
	for _, cp := range list.Items[1:] {
		o.setState(cp, "ignored", "Ignored", "only one ClusterPolicy is reconciled: "+str(sub(list.Items[0], "metadata"), "name"))
	}
	cp := list.Items[0]
	ready, why := o.reconcileDevicePlugin(cp)
	o.reconcileMig(cp)
	if ready {
		o.setState(cp, "ready", "Reconciled", "STAND-IN operator: "+why)
	} else {
		o.setState(cp, "notReady", "OperandNotReady", "STAND-IN operator: "+why)
	}
	return nil
}

func namespace(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if v := os.Getenv("OPERATOR_NAMESPACE"); v != "" {
		return v
	}
	b, err := os.ReadFile(filepath.Join(saDir, "namespace"))
	if err != nil {
		log.Fatalf("STAND-IN gpu-operator: no namespace (--namespace, $OPERATOR_NAMESPACE or %s/namespace): %v", saDir, err)
	}
	return strings.TrimSpace(string(b))
}

func apiserver(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if v := os.Getenv("GPU_OPERATOR_STANDIN_APISERVER"); v != "" {
		return v
	}
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		log.Fatal("STAND-IN gpu-operator: no API server (--apiserver, $GPU_OPERATOR_STANDIN_APISERVER or $KUBERNETES_SERVICE_HOST/PORT)")
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return "https://" + host + ":" + port
}

func main() {
	log.SetFlags(log.LstdFlags | log.LUTC)
	fs := flag.NewFlagSet("standin-gpu-operator", flag.ExitOnError)
	server := fs.String("apiserver", "", "API server URL")
	ns := fs.String("namespace", "", "the operator's namespace (default: $OPERATOR_NAMESPACE, else the service account's)")
	interval := fs.Duration("interval", 2*time.Second, "time between reconciliations")
	once := fs.Bool("once", false, "reconcile once and exit (exit 1 on an API error)")
	_ = fs.Parse(os.Args[1:])
	c, err := newClient(apiserver(*server))
	if err != nil {
		log.Fatalf("STAND-IN gpu-operator: the service account's credentials: %v", err)
	}
	o := &operator{c: c, ns: namespace(*ns), state: map[string]string{}}
	log.Printf("STAND-IN gpu-operator: NOT NVIDIA's operator; namespace %s, API server %s", o.ns, c.base)
	if *once {
		if err := o.reconcile(); err != nil {
			log.Fatalf("STAND-IN gpu-operator: %v", err)
		}
		return
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for {
		if err := o.reconcile(); err != nil {
			log.Printf("STAND-IN gpu-operator: %v", err)
		}
		select {
		case <-stop:
			log.Printf("STAND-IN gpu-operator: stopping")
			return
		case <-tick.C:
		}
	}
}
