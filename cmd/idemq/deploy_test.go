package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// The files an operator installs, in examples/deploy: the tests below run
// them through the binary and parse them, so they keep working as it
// changes.
var deployDir = filepath.Join("..", "..", "examples", "deploy")

// unreachableDB is a database URL nothing answers at: a command that exits
// 0 with it contacted no database (it would have exited 3).
const unreachableDB = "postgres://idemq@127.0.0.1:1/shop"

// --check accepts the example routing file, touches no database (none
// answers at the URL given) and prints what the relay would run with.
func TestCheckExampleConfig(t *testing.T) {
	t.Parallel()
	config := filepath.Join(deployDir, "relay.json")
	r := runIdemq(t, unreachableDB, "relay", "--config", config, "--check")
	if r.code != 0 {
		t.Fatalf("relay --check on %s: exit %d\nstdout: %s\nstderr: %s", config, r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"relay configuration valid", "orders.*=kafka", "webhook/*=webhook", "kafka-0.kafka:9092"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("relay --check printed no %q:\n%s", want, r.stdout)
		}
	}
	var got relayCheck
	mustJSON(t, unreachableDB, &got, "relay", "--config", config, "--check", "--migrate")
	file := readRelayJSON(t, config)
	if !got.OK || !slices.Equal(got.Routes, file.Routes) || !slices.Equal(got.KafkaBrokers, file.KafkaBrokers) || got.NATSURL != file.NATSURL {
		t.Errorf("relay --check --json: %+v, want the routes and brokers of %s: %+v", got, config, file)
	}
}

// --check refuses what the relay would refuse, with exit 2, before it
// reaches for the database.
func TestCheckRefusesBadConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	good := filepath.Join(deployDir, "relay.json")
	for _, c := range []struct {
		name, want string
		args       []string
	}{
		{"unknown field", `unknown field "route"`, []string{"--config", write("typo.json", `{"route": ["a=kafka"], "kafka_brokers": ["k:9092"]}`)}},
		{"kafka route without brokers", "needs --kafka-brokers", []string{"--config", write("nobrokers.json", `{"routes": ["a=kafka"]}`)}},
		{"bad network", "--webhook-allow-network", []string{"--config", write("cidr.json", `{"webhooks": true, "webhook_allow_networks": ["10.0.0.0/33"]}`)}},
		{"no routes", "no routes", []string{"--config", write("empty.json", `{}`)}},
		{"missing file", "--config", []string{"--config", filepath.Join(dir, "absent.json")}},
		{"zero workers", "--workers", []string{"--config", good, "--workers", "0"}},
		{"bad http address", "--http-addr", []string{"--config", good, "--http-addr", "9090"}},
		{"bad log level", "--log-level", []string{"--config", good, "--log-level", "loud"}},
		{"lease ttl below its minimum", "--lease-ttl", []string{"--config", good, "--lease-ttl", "1ms"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runIdemq(t, unreachableDB, append([]string{"relay", "--check"}, c.args...)...)
			if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
				t.Errorf("exit %d, want %d with %q\nstdout: %s\nstderr: %s", r.code, exitUsage, c.want, r.stdout, r.stderr)
			}
		})
	}
}

// relay.env lists every option of the relay, and its settings pass
// --check with the example routing file.
func TestDeployEnvFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(deployDir, "relay.env")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	help := runIdemq(t, unreachableDB, "relay", "--help")
	vars := regexp.MustCompile(`\$([A-Z][A-Z0-9_]*)`).FindAllStringSubmatch(help.stdout, -1)
	if len(vars) < 20 {
		t.Fatalf("relay --help names %d environment variables; the pattern no longer matches its format:\n%s", len(vars), help.stdout)
	}
	for _, v := range vars {
		if !regexp.MustCompile(`\b` + v[1] + `\b`).Match(data) {
			t.Errorf("%s does not document %s (from idemq relay --help): add a commented line with its default", path, v[1])
		}
	}
	settings := envFile(t, path)
	if settings["IDEMQ_CONFIG"] == "" || settings["IDEMQ_HTTP_ADDR"] == "" {
		t.Fatalf("%s sets no IDEMQ_CONFIG or IDEMQ_HTTP_ADDR: %v", path, settings)
	}
	for k := range settings {
		if strings.Contains(k, "DATABASE_URL") || strings.Contains(k, "PASSWORD") {
			t.Errorf("%s sets %s: the database URL is a secret, kept out of it", path, k)
		}
	}
	settings["IDEMQ_CONFIG"] = filepath.Join(deployDir, "relay.json")
	r := runWithEnv(t, env(append(environ(settings), "DATABASE_URL="+unreachableDB)...), "relay", "--check")
	if r.code != 0 {
		t.Fatalf("relay --check with %s: exit %d\nstdout: %s\nstderr: %s", path, r.code, r.stdout, r.stderr)
	}
}

// The systemd unit runs the relay with relay.env, checks it first, does
// not restart on a bad configuration and waits out the shutdown grace.
func TestDeploySystemdUnit(t *testing.T) {
	t.Parallel()
	path := filepath.Join(deployDir, "idemq-relay.service")
	unit := systemdUnit(t, path)
	const bin = "/usr/local/bin/idemq"
	start := strings.Fields(unit.one(t, "Service", "ExecStart"))
	if len(start) < 2 || start[0] != bin || start[1] != "relay" {
		t.Fatalf("%s: ExecStart=%v, want %s relay ...", path, start, bin)
	}
	if pre := unit.one(t, "Service", "ExecStartPre"); pre != strings.Join(start, " ")+" --check" {
		t.Errorf("%s: ExecStartPre=%s, want ExecStart with --check", path, pre)
	}
	if files := unit.values("Service", "EnvironmentFile"); !slices.Contains(files, "/etc/idemq/relay.env") || !slices.Contains(files, "/etc/idemq/database.env") {
		t.Errorf("%s: EnvironmentFile=%v, want relay.env and the secret database.env", path, files)
	}
	if unit.one(t, "Service", "RestartPreventExitStatus") != strconv.Itoa(exitUsage) || unit.one(t, "Service", "Restart") != "on-failure" {
		t.Errorf("%s: want Restart=on-failure and RestartPreventExitStatus=%d", path, exitUsage)
	}
	if stop, err := time.ParseDuration(unit.one(t, "Service", "TimeoutStopSec")); err != nil || stop <= 10*time.Second {
		t.Errorf("%s: TimeoutStopSec=%v (%v), want more than the 10s shutdown grace", path, stop, err)
	}
	if unit.one(t, "Service", "DynamicUser") != "yes" {
		t.Errorf("%s: the relay must not run as root (DynamicUser=yes)", path)
	}
	settings := envFile(t, filepath.Join(deployDir, "relay.env"))
	settings["IDEMQ_CONFIG"] = filepath.Join(deployDir, "relay.json")
	r := runWithEnv(t, env(append(environ(settings), "DATABASE_URL="+unreachableDB)...), append(start[1:], "--check")...)
	if r.code != 0 {
		t.Fatalf("%s: ExecStart with --check: exit %d\nstdout: %s\nstderr: %s", path, r.code, r.stdout, r.stderr)
	}
}

// The Kubernetes manifests: a relay Deployment whose probes, scrape
// annotations and arguments fit the binary, with the database URL from a
// Secret; a migrate Job; the routing file in a ConfigMap equal to
// relay.json.
func TestDeployKubernetes(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(deployDir, "k8s")

	var cm struct {
		Kind     string            `json:"kind"`
		Metadata metadata          `json:"metadata"`
		Data     map[string]string `json:"data"`
	}
	readYAML(t, filepath.Join(dir, "configmap.yaml"), &cm)
	if cm.Kind != "ConfigMap" {
		t.Fatalf("configmap.yaml: kind %q", cm.Kind)
	}
	var fromMap, fromFile any
	if err := json.Unmarshal([]byte(cm.Data["relay.json"]), &fromMap); err != nil {
		t.Fatalf("configmap.yaml: relay.json: %v", err)
	}
	raw, err := os.ReadFile(filepath.Join(deployDir, "relay.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &fromFile); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromMap, fromFile) {
		t.Errorf("configmap.yaml's relay.json differs from examples/deploy/relay.json:\n%s\nvs\n%s", cm.Data["relay.json"], raw)
	}

	var deploy workload
	readYAML(t, filepath.Join(dir, "relay-deployment.yaml"), &deploy)
	if deploy.Kind != "Deployment" || deploy.APIVersion != "apps/v1" {
		t.Fatalf("relay-deployment.yaml: %s %s, want apps/v1 Deployment", deploy.APIVersion, deploy.Kind)
	}
	pod := deploy.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("relay-deployment.yaml: %d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "relay" {
		t.Fatalf("relay container args %v: want relay ...", c.Args)
	}
	flag := func(name string) string {
		if i := slices.Index(c.Args, name); i >= 0 && i+1 < len(c.Args) {
			return c.Args[i+1]
		}
		return ""
	}
	_, port, _ := strings.Cut(flag("--http-addr"), ":")
	if port == "" {
		t.Fatalf("relay container args %v: no --http-addr :PORT", c.Args)
	}
	containerPort := func(p any) string {
		for _, cp := range c.Ports {
			if cp.Name == p || strconv.Itoa(cp.ContainerPort) == p || float64(cp.ContainerPort) == p {
				return strconv.Itoa(cp.ContainerPort)
			}
		}
		return ""
	}
	for _, probe := range []struct {
		name, path string
		p          *probe
	}{{"readinessProbe", "/readyz", c.ReadinessProbe}, {"livenessProbe", "/healthz", c.LivenessProbe}} {
		switch {
		case probe.p == nil || probe.p.HTTPGet == nil:
			t.Errorf("relay container: no %s httpGet", probe.name)
		case probe.p.HTTPGet.Path != probe.path || containerPort(probe.p.HTTPGet.Port) != port:
			t.Errorf("relay container: %s on %s port %v, want %s on the --http-addr port %s", probe.name, probe.p.HTTPGet.Path, probe.p.HTTPGet.Port, probe.path, port)
		}
	}
	if a := pod.Metadata.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != port || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("relay pod annotations %v: want prometheus.io/scrape true, port %s, path /metrics", a, port)
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || *g <= 10 {
		t.Errorf("relay pod: terminationGracePeriodSeconds %v, want more than the 10s shutdown grace", g)
	}
	checkPodSecurity(t, "relay", pod.Spec, c)
	checkDatabaseSecret(t, "relay", c)

	// The routing file is where --config looks for it.
	configDir := filepath.Dir(flag("--config"))
	mounted := slices.ContainsFunc(c.VolumeMounts, func(m volumeMount) bool {
		return m.MountPath == configDir && slices.ContainsFunc(pod.Spec.Volumes, func(v volume) bool {
			return v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Metadata.Name
		})
	})
	if !mounted {
		t.Errorf("relay container: the ConfigMap %s is not mounted at %s, the directory of --config", cm.Metadata.Name, configDir)
	}
	// The container's command line passes --check with the ConfigMap's
	// file and the container's environment.
	config := filepath.Join(t.TempDir(), filepath.Base(flag("--config")))
	if err := os.WriteFile(config, []byte(cm.Data[filepath.Base(config)]), 0o600); err != nil {
		t.Fatal(err)
	}
	args := slices.Clone(c.Args)
	args[slices.Index(args, "--config")+1] = config
	r := runWithEnv(t, env(append(c.plainEnv(), "DATABASE_URL="+unreachableDB)...), append(args, "--check")...)
	if r.code != 0 {
		t.Fatalf("relay container args %v with --check: exit %d\nstdout: %s\nstderr: %s", c.Args, r.code, r.stdout, r.stderr)
	}

	var job workload
	readYAML(t, filepath.Join(dir, "migrate-job.yaml"), &job)
	if job.Kind != "Job" || job.APIVersion != "batch/v1" || len(job.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("migrate-job.yaml: %s %s with %d containers, want one batch/v1 Job container", job.APIVersion, job.Kind, len(job.Spec.Template.Spec.Containers))
	}
	jc := job.Spec.Template.Spec.Containers[0]
	if len(jc.Args) == 0 || jc.Args[0] != "migrate" {
		t.Errorf("migrate container args %v: want migrate ...", jc.Args)
	}
	if rp := job.Spec.Template.Spec.RestartPolicy; rp != "OnFailure" && rp != "Never" {
		t.Errorf("migrate Job: restartPolicy %q", rp)
	}
	checkPodSecurity(t, "migrate", job.Spec.Template.Spec, jc)
	checkDatabaseSecret(t, "migrate", jc)
	// Its arguments are accepted: it gets as far as the database (exit 3).
	r = runWithEnv(t, env(append(jc.plainEnv(), "DATABASE_URL="+unreachableDB, "IDEMQ_CONNECT_TIMEOUT=1s")...), jc.Args...)
	if r.code != exitUnreachable {
		t.Errorf("migrate container args %v on an unreachable database: exit %d, want %d\nstderr: %s", jc.Args, r.code, exitUnreachable, r.stderr)
	}

	var kust struct {
		Resources []string `json:"resources"`
	}
	readYAML(t, filepath.Join(dir, "kustomization.yaml"), &kust)
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" && !slices.Contains(kust.Resources, base) {
			t.Errorf("kustomization.yaml does not list %s", base)
		}
	}
}

// Every field of the routing file is in the README's table.
func TestDeployConfigFieldsDocumented(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join(deployDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeFor[sinkConfig]()
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" && !strings.Contains(string(readme), "| `"+name+"` |") {
			t.Errorf("examples/deploy/README.md has no table row for the --config field %q", name)
		}
	}
}

// The Dockerfile builds cmd/idemq statically in one stage and runs it as a
// non-root user in a minimal one. (Docker need not be installed: this
// checks its shape.)
func TestDeployDockerfile(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var froms, users []string
	var build string
	for line := range strings.Lines(string(data)) {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			froms = append(froms, strings.Join(fields[1:], " "))
		case "USER":
			users = append(users, fields[1])
		case "RUN":
			if strings.Contains(line, "go build") {
				build = line
			}
		}
	}
	if len(froms) < 2 {
		t.Errorf("Dockerfile: %d stages, want a build stage and a final one", len(froms))
	} else if final := froms[len(froms)-1]; !strings.Contains(final, "distroless/static") && final != "scratch" {
		t.Errorf("Dockerfile: final stage FROM %s, want distroless/static or scratch", final)
	}
	if len(users) == 0 {
		t.Error("Dockerfile: no USER: the image would run as root")
	} else if u := users[len(users)-1]; u == "root" || u == "0" || strings.HasPrefix(u, "0:") {
		t.Errorf("Dockerfile: USER %s", u)
	}
	if !strings.Contains(build, "cd cmd/idemq") || !strings.Contains(build, "CGO_ENABLED=0") {
		t.Errorf("Dockerfile: the go build %q must build cmd/idemq (its own module) with CGO_ENABLED=0", build)
	}
	if !strings.Contains(string(data), "COPY --from=build") {
		t.Error("Dockerfile: the final stage copies nothing from the build stage")
	}
}

// Kubernetes objects, as much of them as the tests read.
type (
	metadata struct {
		Name        string            `json:"name"`
		Annotations map[string]string `json:"annotations"`
	}
	workload struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Metadata   metadata `json:"metadata"`
		Spec       struct {
			Template struct {
				Metadata metadata `json:"metadata"`
				Spec     podSpec  `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	podSpec struct {
		TerminationGracePeriodSeconds *int64 `json:"terminationGracePeriodSeconds"`
		RestartPolicy                 string `json:"restartPolicy"`
		SecurityContext               struct {
			RunAsNonRoot *bool  `json:"runAsNonRoot"`
			RunAsUser    *int64 `json:"runAsUser"`
		} `json:"securityContext"`
		Containers []container `json:"containers"`
		Volumes    []volume    `json:"volumes"`
	}
	container struct {
		Name  string   `json:"name"`
		Image string   `json:"image"`
		Args  []string `json:"args"`
		Ports []struct {
			Name          string `json:"name"`
			ContainerPort int    `json:"containerPort"`
		} `json:"ports"`
		Env []struct {
			Name      string `json:"name"`
			Value     string `json:"value"`
			ValueFrom *struct {
				SecretKeyRef *struct {
					Name string `json:"name"`
					Key  string `json:"key"`
				} `json:"secretKeyRef"`
			} `json:"valueFrom"`
		} `json:"env"`
		ReadinessProbe  *probe        `json:"readinessProbe"`
		LivenessProbe   *probe        `json:"livenessProbe"`
		VolumeMounts    []volumeMount `json:"volumeMounts"`
		SecurityContext struct {
			AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation"`
			ReadOnlyRootFilesystem   *bool `json:"readOnlyRootFilesystem"`
		} `json:"securityContext"`
	}
	probe struct {
		HTTPGet *struct {
			Path string `json:"path"`
			Port any    `json:"port"`
		} `json:"httpGet"`
	}
	volumeMount struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	}
	volume struct {
		Name      string `json:"name"`
		ConfigMap *struct {
			Name string `json:"name"`
		} `json:"configMap"`
	}
)

// plainEnv is the container's environment set by value, as NAME=VALUE.
func (c container) plainEnv() []string {
	var out []string
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			out = append(out, e.Name+"="+e.Value)
		}
	}
	return out
}

// checkDatabaseSecret fails unless c takes DATABASE_URL from a Secret and
// no value of its environment looks like a connection string.
func checkDatabaseSecret(t *testing.T, what string, c container) {
	t.Helper()
	found := false
	for _, e := range c.Env {
		if strings.Contains(e.Value, "postgres://") || strings.Contains(e.Value, "postgresql://") || strings.Contains(strings.ToLower(e.Name), "password") && e.Value != "" {
			t.Errorf("%s container: %s has a literal value; credentials come from a Secret", what, e.Name)
		}
		if e.Name == "DATABASE_URL" {
			found = e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name != "" && e.ValueFrom.SecretKeyRef.Key != ""
		}
	}
	if !found {
		t.Errorf("%s container: DATABASE_URL does not come from a secretKeyRef", what)
	}
}

// checkPodSecurity fails unless the pod runs as a non-root user and the
// container cannot escalate.
func checkPodSecurity(t *testing.T, what string, spec podSpec, c container) {
	t.Helper()
	sc := spec.SecurityContext
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("%s pod: want runAsNonRoot and a non-zero runAsUser", what)
	}
	if p := c.SecurityContext.AllowPrivilegeEscalation; p == nil || *p {
		t.Errorf("%s container: want allowPrivilegeEscalation: false", what)
	}
	if c.Image == "" {
		t.Errorf("%s container: no image", what)
	}
}

// readYAML decodes the one object in the YAML file at path into v.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "\n---") {
		t.Fatalf("%s: one object per file, please", path)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// readRelayJSON reads a --config file the way the relay does.
func readRelayJSON(t *testing.T, path string) sinkConfig {
	t.Helper()
	c, err := readSinkConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// envFile returns the settings of a systemd EnvironmentFile: KEY=VALUE
// lines, # comments.
func envFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=VALUE", path, line)
		}
		out[k] = v
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func environ(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

// unitFile is a parsed systemd unit: section -> key -> values in order.
type unitFile map[string]map[string][]string

func systemdUnit(t *testing.T, path string) unitFile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unitFile{}
	var section string
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: %q is not KEY=VALUE in a section", path, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unitFile) values(section, key string) []string { return u[section][key] }

func (u unitFile) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u[section][key]
	if len(v) != 1 {
		t.Fatalf("[%s] %s: %d values, want 1", section, key, len(v))
	}
	return v[0]
}
