package deploy

// The deployment files cannot be run here (no container engine, no
// cluster), so this test checks what can be checked against the code:
//
//   - every ALLOT_ variable a compose service or a Kubernetes container gets
//     is read by the binary it runs (the envconfig tags of its configuration
//     types in internal/binaries, embedded structs such as config.Common
//     followed), and its value parses as the field's type;
//   - every command runs /usr/local/bin/<binary> with <binary> a directory
//     under cmd/ that deploy/Dockerfile builds, with flags the binary defines;
//   - health checks and readiness probes hit /readyz (/healthz for the
//     notifier) on the port of the address the binary listens on;
//   - the setup step (allotctl setup) runs once, one-shot: the compose
//     services that use NATS wait for it to complete, and k8s runs it as a
//     Job with ALLOT_STREAM_REPLICAS matching the NATS cluster;
//   - ingest and allocator run ≥ 2 replicas, ALLOT_PARTITIONS agrees,
//     graceful-termination budgets exceed the binaries' shutdown times, and
//     NATS runs JetStream with sync_interval always.
//
// The binaries' variables come from the very types their mains load
// (internal/binaries), by reflection, never listed here, so a renamed
// variable fails the test; their flags are read from the Go source.
// TestChecksCatchBreakage shows each check failing on a deliberately broken
// copy of the files.

import (
	"encoding/base64"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/binaries"
)

// ---------------------------------------------------------------------------
// What the code says: binaries, their ALLOT_ variables and flags.

type binary struct {
	name  string
	env   map[string]binaries.Var // full name, ALLOT_…
	flags map[string]bool
	err   error // the binary cannot be read; reported where it is used
}

type world struct {
	root  string
	bins  map[string]*binary // every directory under cmd/
	built map[string]bool    // what deploy/Dockerfile builds, by binary name
}

const binDir = "/usr/local/bin/"

func loadWorld(t *testing.T) *world {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	w := &world{root: root, bins: map[string]*binary{}}
	dirs, err := os.ReadDir(filepath.Join(root, "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		// A binary this test cannot read fails only where a deployment file
		// uses it: other cmd/ directories are not its business.
		w.bins[d.Name()] = loadBinary(root, d.Name())
	}
	df, err := os.ReadFile(filepath.Join(root, "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	w.built = map[string]bool{}
	for _, m := range regexp.MustCompile(`\./(cmd|internal/cmd)/([a-z0-9_-]+)`).FindAllStringSubmatch(string(df), -1) {
		w.built[m[2]] = true
	}
	return w
}

func loadBinary(root, name string) *binary {
	b := &binary{name: name, env: map[string]binaries.Var{}, flags: map[string]bool{"h": true, "help": true}}
	i := slices.IndexFunc(binaries.All, func(b binaries.Binary) bool { return b.Dir == "cmd/"+name })
	if i < 0 {
		b.err = fmt.Errorf("cmd/%s is not in internal/binaries.All", name)
		return b
	}
	for _, v := range binaries.Vars(binaries.All[i].Config...) {
		b.env[v.Name] = v
	}
	b.err = readFlags(filepath.Join(root, "cmd", name), b.flags)
	return b
}

// readFlags adds the flags the non-test Go files of dir define:
// fs.StringVar(&v, "name", …), fs.String("name", …), fs.Var(v, "name", …).
func readFlags(dir string, flags map[string]bool) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			idx := -1
			switch sel.Sel.Name {
			case "String", "Int", "Int64", "Uint", "Uint64", "Bool", "Float64", "Duration", "Func", "BoolFunc":
				idx = 0
			case "StringVar", "IntVar", "Int64Var", "UintVar", "Uint64Var", "BoolVar", "Float64Var", "DurationVar", "Var", "TextVar":
				idx = 1
			}
			if idx < 0 || idx >= len(call.Args) {
				return true
			}
			if lit, ok := call.Args[idx].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					flags[s] = true
				}
			}
			return true
		})
	}
	return nil
}

var durationType = reflect.TypeFor[time.Duration]()

// typeName names a variable's type as messages say it: "int",
// "time.Duration", "string" (also for named string types).
func typeName(t reflect.Type) string {
	if t == durationType {
		return "time.Duration"
	}
	return t.Kind().String()
}

// validValue reports whether value parses as envconfig would parse it
// into a field of type t.
func validValue(t reflect.Type, value string) error {
	var err error
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if t == durationType {
			_, err = time.ParseDuration(value)
		} else {
			_, err = strconv.ParseInt(value, 0, t.Bits())
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		_, err = strconv.ParseUint(value, 0, t.Bits())
	case reflect.Float32, reflect.Float64:
		_, err = strconv.ParseFloat(value, t.Bits())
	case reflect.Bool:
		_, err = strconv.ParseBool(value)
	}
	return err
}

// ---------------------------------------------------------------------------
// Shared checks of one process: its command and its environment.

// process is one container: its command and effective ALLOT_ environment.
type process struct {
	where string // "compose service ingest", "Deployment allocator"
	cmd   []string
	env   map[string]string // as given (only ALLOT_ variables)
}

// checkCommand returns the binary the process runs, or "" with problems.
func (w *world) checkCommand(p process, problems *[]string) *binary {
	if len(p.cmd) == 0 {
		*problems = append(*problems, p.where+": no command: the image has no ENTRYPOINT, name the binary")
		return nil
	}
	if !strings.HasPrefix(p.cmd[0], binDir) {
		*problems = append(*problems, fmt.Sprintf("%s: command %q is not under %s", p.where, p.cmd[0], binDir))
		return nil
	}
	name := strings.TrimPrefix(p.cmd[0], binDir)
	b := w.bins[name]
	if b == nil {
		*problems = append(*problems, fmt.Sprintf("%s: runs %q, but there is no cmd/%s", p.where, name, name))
		return nil
	}
	if b.err != nil {
		*problems = append(*problems, fmt.Sprintf("%s: cannot read the configuration of cmd/%s: %v", p.where, name, b.err))
		return nil
	}
	if !w.built[name] {
		*problems = append(*problems, fmt.Sprintf("%s: runs %q, which deploy/Dockerfile does not build", p.where, name))
	}
	for _, arg := range p.cmd[1:] {
		if !strings.HasPrefix(arg, "-") || arg == "-" {
			continue
		}
		flag, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !b.flags[flag] {
			*problems = append(*problems, fmt.Sprintf("%s: %s has no flag -%s", p.where, name, flag))
		}
	}
	return b
}

func (w *world) checkEnv(p process, b *binary, problems *[]string) {
	for _, k := range sortedKeys(p.env) {
		v, ok := b.env[k]
		if !ok {
			*problems = append(*problems, fmt.Sprintf("%s: %s is not read by %s (not a variable of its type in internal/binaries)", p.where, k, b.name))
			continue
		}
		if err := validValue(v.Type, p.env[k]); err != nil {
			*problems = append(*problems, fmt.Sprintf("%s: %s=%q is not a valid %s", p.where, k, p.env[k], typeName(v.Type)))
		}
	}
}

// effective is the value the binary runs with: given, else the default.
func effective(p process, b *binary, key string) (string, bool) {
	if v, ok := p.env[key]; ok {
		return v, true
	}
	v, ok := b.env[key]
	if !ok || !v.HasDefault {
		return "", false
	}
	return v.Default, true
}

// healthEndpoint is where each long-running binary answers probes: the
// variable holding its listen address and the path of its readiness check.
var healthEndpoint = map[string]struct{ addrVar, path string }{
	"ingest":    {"ALLOT_HTTP_ADDR", "/readyz"},
	"allocator": {"ALLOT_METRICS_ADDR", "/readyz"},
	"notifier":  {"ALLOT_NOTIFY_METRICS_ADDR", "/healthz"},
}

// listenPort is the port of the binary's probe address.
func listenPort(p process, b *binary) (string, error) {
	he, ok := healthEndpoint[b.name]
	if !ok {
		return "", fmt.Errorf("%s serves no health endpoint", b.name)
	}
	addr, ok := effective(p, b, he.addrVar)
	if !ok || addr == "" {
		return "", fmt.Errorf("%s is empty: %s serves no health endpoint", he.addrVar, b.name)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%s=%q: %v", he.addrVar, addr, err)
	}
	return port, nil
}

func allotEnv(m map[string]any) map[string]string {
	env := map[string]string{}
	for k, v := range m {
		if strings.HasPrefix(k, "ALLOT_") {
			s, _ := v.(string)
			env[k] = s
		}
	}
	return env
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ---------------------------------------------------------------------------
// compose.yaml

func (w *world) checkCompose(doc any) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	services := digMap(doc, "services")
	if len(services) == 0 {
		return []string{"compose: no services"}
	}
	// The allot image: the tag of the services built from deploy/Dockerfile.
	allotImages := map[string]bool{}
	for _, name := range sortedKeys(services) {
		if df := digStr(services[name], "build", "dockerfile"); df != "" {
			if df != "deploy/Dockerfile" || digStr(services[name], "build", "context") != ".." {
				bad("compose service %s: build must be context .. with dockerfile deploy/Dockerfile", name)
			}
			allotImages[digStr(services[name], "image")] = true
		}
	}
	if len(allotImages) != 1 {
		bad("compose: want exactly one allot image tag built from deploy/Dockerfile, got %v", sortedKeys(allotImages))
	}
	running := map[string]int{} // long-running allot binaries → services
	partitions := map[string]string{}
	var migrations, allocators []string // services that run the migration step, and allocators
	var setups, natsUsers []string      // services that run the setup step, and the others that use NATS
	for _, name := range sortedKeys(services) {
		svc := services[name]
		where := "compose service " + name
		image := digStr(svc, "image")
		var envMap map[string]any
		switch e := dig(svc, "environment").(type) {
		case map[string]any:
			envMap = e
		case []any:
			envMap = map[string]any{}
			for _, kv := range strList(e) {
				k, v, _ := strings.Cut(kv, "=")
				envMap[k] = v
			}
		}
		if dig(svc, "env_file") != nil {
			bad("%s: env_file hides variables from this test; use environment", name)
		}
		env := allotEnv(envMap)
		for _, dep := range sortedKeys(digMap(svc, "depends_on")) {
			target, ok := services[dep]
			cond := digStr(svc, "depends_on", dep, "condition")
			switch {
			case !ok:
				bad("%s: depends on unknown service %s", where, dep)
			case cond == "service_healthy" && digMap(target, "healthcheck") == nil:
				bad("%s: waits for %s to be healthy, but %s has no healthcheck", where, dep, dep)
			case cond != "service_healthy" && cond != "service_started" && cond != "service_completed_successfully":
				bad("%s: depends_on %s: condition %q", where, dep, cond)
			}
		}
		if !allotImages[image] {
			if len(env) > 0 {
				bad("%s: sets %v but does not run the allot image", where, sortedKeys(env))
			}
			continue
		}
		p := process{where: where, cmd: strList(dig(svc, "command")), env: env}
		b := w.checkCommand(p, &problems)
		if b == nil {
			continue
		}
		w.checkEnv(p, b, &problems)
		migration := b.name == "allocator" && slices.Contains(p.cmd, "-migrate-only")
		w.checkEndpoints(p, b, services, !migration, &problems)
		if isSetup(b, p) {
			// The setup step: one shot, as the migration step.
			setups = append(setups, name)
			partitions[name], _ = effective(p, b, "ALLOT_PARTITIONS")
			if r := digStr(svc, "restart"); r != "" && r != "no" && r != "on-failure" {
				bad("%s: the setup step exits when done; restart %q would run it forever", where, r)
			}
			continue
		}
		if !migration && slices.Contains([]string{"ingest", "allocator", "notifier", "audit"}, b.name) {
			natsUsers = append(natsUsers, name)
		}
		if migration {
			// The migration step: one shot, MySQL only, never restarted
			// once it has succeeded.
			migrations = append(migrations, name)
			if r := digStr(svc, "restart"); r != "" && r != "no" && r != "on-failure" {
				bad("%s: the migration step exits when done; restart %q would run it forever", where, r)
			}
			continue
		}
		if b.name == "ingest" || b.name == "allocator" {
			partitions[name], _ = effective(p, b, "ALLOT_PARTITIONS")
		}
		if b.name == "allocator" {
			allocators = append(allocators, name)
		}
		if dig(svc, "profiles") != nil {
			continue // a one-shot tool
		}
		running[b.name]++
		he, probed := healthEndpoint[b.name]
		test := strList(dig(svc, "healthcheck", "test"))
		if !probed {
			bad("%s: %s is not a long-running service; give it a profile", where, b.name)
			continue
		}
		if len(test) != 3 || test[0] != "CMD" || !strings.HasPrefix(test[1], binDir) {
			bad("%s: healthcheck must be [CMD, %sprobe, URL], got %q", where, binDir, test)
			continue
		}
		if probe := strings.TrimPrefix(test[1], binDir); !w.built[probe] {
			bad("%s: healthcheck runs %s, which deploy/Dockerfile does not build", where, probe)
		}
		u, err := url.Parse(test[2])
		port, perr := listenPort(p, b)
		switch {
		case err != nil || (u.Hostname() != "127.0.0.1" && u.Hostname() != "localhost"):
			bad("%s: healthcheck URL %q must be on 127.0.0.1", where, test[2])
		case perr != nil:
			bad("%s: %v", where, perr)
		case u.Port() != port || u.Path != he.path:
			bad("%s: healthcheck %s, but %s serves %s on port %s (%s)", where, test[2], b.name, he.path, port, he.addrVar)
		}
	}
	if len(migrations) != 1 {
		bad("compose: want one migration step (allocator -migrate-only), got %v", migrations)
	} else {
		for _, a := range allocators {
			if digStr(services[a], "depends_on", migrations[0], "condition") != "service_completed_successfully" {
				bad("compose service %s: must wait for %s with condition service_completed_successfully", a, migrations[0])
			}
		}
	}
	if len(setups) != 1 {
		bad("compose: want one setup step (allotctl setup), got %v", setups)
	} else {
		// No runtime binary creates a stream: each waits for the setup.
		for _, n := range natsUsers {
			if digStr(services[n], "depends_on", setups[0], "condition") != "service_completed_successfully" {
				bad("compose service %s: must wait for %s with condition service_completed_successfully", n, setups[0])
			}
		}
	}
	for bin, want := range map[string]int{"ingest": 1, "allocator": 2, "notifier": 1} {
		if running[bin] < want {
			bad("compose: %d %s service(s), want at least %d", running[bin], bin, want)
		}
	}
	checkSame("compose", "ALLOT_PARTITIONS", partitions, &problems)
	return append(problems, w.checkComposeShards(services)...)
}

// isSetup says whether p runs the setup step, `allotctl setup`.
func isSetup(b *binary, p process) bool {
	return b.name == "allotctl" && len(p.cmd) > 1 && p.cmd[1] == "setup"
}

// composeDefaults matches compose's ${NAME:-default} interpolation; the
// checks see the default (the passwords in the URLs and DSNs use it).
var composeDefaults = regexp.MustCompile(`\$\{[A-Za-z0-9_]+:-([^}]*)\}`)

// checkEndpoints checks that NATS and MySQL addresses name compose services.
// A process that does not need NATS (the migration step) may leave
// ALLOT_NATS_URL unset.
func (w *world) checkEndpoints(p process, b *binary, services map[string]any, needsNATS bool, problems *[]string) {
	if v, ok := p.env["ALLOT_NATS_URL"]; ok {
		u, err := url.Parse(composeDefaults.ReplaceAllString(v, "$1"))
		if err != nil || u.Scheme != "nats" || services[u.Hostname()] == nil {
			*problems = append(*problems, fmt.Sprintf("%s: ALLOT_NATS_URL %q does not name a compose service", p.where, v))
		}
	} else if _, reads := b.env["ALLOT_NATS_URL"]; reads && needsNATS {
		*problems = append(*problems, fmt.Sprintf("%s: ALLOT_NATS_URL is not set (empty means the embedded server of make run)", p.where))
	}
	if v, ok := p.env["ALLOT_MYSQL_DSN"]; ok {
		m := regexp.MustCompile(`@tcp\(([^:)]+):\d+\)/`).FindStringSubmatch(v)
		if m == nil || services[m[1]] == nil {
			*problems = append(*problems, fmt.Sprintf("%s: ALLOT_MYSQL_DSN %q does not name a compose service", p.where, v))
		}
	}
}

func checkSame(where, key string, byName map[string]string, problems *[]string) {
	seen := map[string][]string{}
	for _, n := range sortedKeys(byName) {
		seen[byName[n]] = append(seen[byName[n]], n)
	}
	if len(seen) > 1 {
		*problems = append(*problems, fmt.Sprintf("%s: %s differs between services: %v (it is fixed when the request stream is created)", where, key, seen))
	}
}

// checkNATS checks the NATS service of compose.yaml and its config file.
func checkNATS(doc any, conf string) []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	svc := dig(doc, "services", "nats")
	if svc == nil {
		return []string{"compose: no nats service"}
	}
	image := digStr(svc, "image")
	m := regexp.MustCompile(`^nats:2\.(\d+)`).FindStringSubmatch(image)
	if minor, _ := strconv.Atoi(valueOr(m, 1)); m == nil || minor < 11 {
		bad("nats image %q: want nats:2.11 or later (pinned consumers)", image)
	}
	cmd := strList(dig(svc, "command"))
	if !slices.Contains(cmd, "--jetstream") {
		bad("nats command %q lacks --jetstream", cmd)
	}
	confPath := ""
	if i := slices.Index(cmd, "--config"); i >= 0 && i+1 < len(cmd) {
		confPath = cmd[i+1]
	}
	mounted := false
	for _, v := range strList(dig(svc, "volumes")) {
		if strings.HasPrefix(v, "./nats/nats.conf:"+confPath) && confPath != "" {
			mounted = true
		}
	}
	if !mounted {
		bad("nats: ./nats/nats.conf is not mounted at the --config path %q", confPath)
	}
	if !regexp.MustCompile(`(?m)^\s*sync_interval:\s*always\s*$`).MatchString(conf) {
		bad("nats.conf: no `sync_interval: always` in the jetstream block")
	}
	store := regexp.MustCompile(`(?m)^\s*store_dir:\s*(\S+)\s*$`).FindStringSubmatch(conf)
	storeMounted := false
	for _, v := range strList(dig(svc, "volumes")) {
		if store != nil && strings.HasSuffix(v, ":"+store[1]) {
			storeMounted = true
		}
	}
	if !storeMounted {
		bad("nats: the JetStream store_dir of nats.conf is not a volume")
	}
	return problems
}

func valueOr(m []string, i int) string {
	if i < len(m) {
		return m[i]
	}
	return ""
}

// ---------------------------------------------------------------------------
// Kubernetes manifests

type k8sObjects struct {
	byKind map[string]map[string]any // kind → name → object
}

func indexK8s(docs []any) (k8sObjects, []string) {
	o := k8sObjects{byKind: map[string]map[string]any{}}
	var problems []string
	for _, d := range docs {
		kind, name := digStr(d, "kind"), digStr(d, "metadata", "name")
		if kind == "" || name == "" {
			problems = append(problems, fmt.Sprintf("k8s: object without kind or metadata.name: %v", d))
			continue
		}
		if o.byKind[kind] == nil {
			o.byKind[kind] = map[string]any{}
		}
		if o.byKind[kind][name] != nil {
			problems = append(problems, fmt.Sprintf("k8s: two %s named %s", kind, name))
		}
		o.byKind[kind][name] = d
	}
	return o, problems
}

// keys returns the data of a ConfigMap or Secret, nil when it is missing.
func (o k8sObjects) keys(kind, name string) (map[string]string, error) {
	obj := o.byKind[kind][name]
	if obj == nil {
		return nil, fmt.Errorf("no %s %s", kind, name)
	}
	out := map[string]string{}
	for k, v := range digMap(obj, "data") {
		s, _ := v.(string)
		if kind == "Secret" {
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return nil, fmt.Errorf("Secret %s: data.%s is not base64", name, k)
			}
			s = string(b)
		}
		out[k] = s
	}
	for k, v := range digMap(obj, "stringData") {
		s, _ := v.(string)
		out[k] = s
	}
	return out, nil
}

func (w *world) checkK8s(docs []any, natsValues any) []string {
	o, problems := indexK8s(docs)
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	usedConfigMaps := map[string]bool{}
	partitions := map[string]string{}
	deployments := o.byKind["Deployment"]
	seen := map[string]bool{}
	setupJob := false
	type workload struct{ kind, name string }
	var workloads []workload
	for _, kind := range []string{"Deployment", "Job"} {
		for _, name := range sortedKeys(o.byKind[kind]) {
			workloads = append(workloads, workload{kind, name})
		}
	}
	for _, wl := range workloads {
		dname, d := wl.name, o.byKind[wl.kind][wl.name]
		containers := digList(d, "spec", "template", "spec", "containers")
		if len(containers) != 1 {
			bad("%s %s: want one container, got %d", wl.kind, dname, len(containers))
			continue
		}
		c := containers[0]
		p := process{where: wl.kind + " " + dname, cmd: strList(dig(c, "command")), env: map[string]string{}}
		for _, ef := range digList(c, "envFrom") {
			kind, ref := "ConfigMap", digStr(ef, "configMapRef", "name")
			if ref == "" {
				kind, ref = "Secret", digStr(ef, "secretRef", "name")
			}
			data, err := o.keys(kind, ref)
			if err != nil {
				bad("%s: envFrom: %v", p.where, err)
				continue
			}
			if kind == "ConfigMap" {
				usedConfigMaps[ref] = true
			}
			for k, v := range data {
				if !strings.HasPrefix(k, "ALLOT_") {
					bad("%s: %s %s holds %s: only ALLOT_ variables belong there", p.where, kind, ref, k)
				}
				p.env[k] = v
			}
		}
		for _, e := range digList(c, "env") {
			name := digStr(e, "name")
			v := digStr(e, "value")
			for kind, refKey := range map[string]string{"ConfigMap": "configMapKeyRef", "Secret": "secretKeyRef"} {
				if ref := digMap(e, "valueFrom", refKey); ref != nil {
					data, err := o.keys(kind, digStr(ref, "name"))
					if err != nil {
						bad("%s: env %s: %v", p.where, name, err)
						continue
					}
					var ok bool
					if v, ok = data[digStr(ref, "key")]; !ok {
						bad("%s: env %s: %s %s has no key %s", p.where, name, kind, digStr(ref, "name"), digStr(ref, "key"))
					}
				}
			}
			if strings.HasPrefix(name, "ALLOT_") {
				p.env[name] = v
			}
		}
		b := w.checkCommand(p, &problems)
		if b == nil {
			continue
		}
		w.checkEnv(p, b, &problems)
		if wl.kind == "Job" {
			if isSetup(b, p) {
				setupJob = true
				partitions[dname], _ = effective(p, b, "ALLOT_PARTITIONS")
				replicas, _ := effective(p, b, "ALLOT_STREAM_REPLICAS")
				if nodes := digStr(natsValues, "config", "cluster", "replicas"); replicas != nodes {
					bad("%s: ALLOT_STREAM_REPLICAS=%s, but the NATS cluster of nats-values.yaml has %s nodes", p.where, replicas, nodes)
				}
				if r := digStr(d, "spec", "template", "spec", "restartPolicy"); r != "OnFailure" && r != "Never" {
					bad("%s: restartPolicy %q: a Job's pod must be OnFailure or Never", p.where, r)
				}
			}
			continue
		}
		seen[b.name] = true
		if b.name != "ingest" && b.name != "allocator" {
			continue
		}
		partitions[dname], _ = effective(p, b, "ALLOT_PARTITIONS")
		if n, _ := strconv.Atoi(digStr(d, "spec", "replicas")); n < 2 {
			bad("%s: replicas %q, want at least 2", p.where, digStr(d, "spec", "replicas"))
		}
		port, err := listenPort(p, b)
		if err != nil {
			bad("%s: %v", p.where, err)
			continue
		}
		for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
			got := digStr(c, probe, "httpGet", "path")
			gotPort := containerPort(c, digStr(c, probe, "httpGet", "port"))
			if got != path || gotPort != port {
				bad("%s: %s is %s on port %s, want %s on port %s (%s)", p.where, probe, got, gotPort, path, port, healthEndpoint[b.name].addrVar)
			}
		}
		if digStr(c, "resources", "requests", "cpu") == "" || digStr(c, "resources", "requests", "memory") == "" || digStr(c, "resources", "limits", "memory") == "" {
			bad("%s: resources need requests.cpu, requests.memory and limits.memory", p.where)
		}
		grace, _ := strconv.Atoi(digStr(d, "spec", "template", "spec", "terminationGracePeriodSeconds"))
		need := 30 * time.Second // allocator: a batch, 5s metrics shutdown, NATS drain
		if b.name == "ingest" {
			v, _ := effective(p, b, "ALLOT_INGEST_SHUTDOWN_TIMEOUT")
			shutdown, err := time.ParseDuration(v)
			if err != nil {
				bad("%s: ALLOT_INGEST_SHUTDOWN_TIMEOUT %q: %v", p.where, v, err)
			}
			sleep, _ := strconv.Atoi(digStr(c, "lifecycle", "preStop", "sleep", "seconds"))
			need = shutdown + 5*time.Second /* NATS drain */ + time.Duration(sleep)*time.Second
		}
		if time.Duration(grace)*time.Second <= need {
			bad("%s: terminationGracePeriodSeconds %d, want more than %s", p.where, grace, need)
		}
	}
	for _, bin := range []string{"ingest", "allocator"} {
		if !seen[bin] {
			bad("k8s: no Deployment runs %s", bin)
		}
	}
	if !setupJob {
		bad("k8s: no Job runs allotctl setup (the runtime binaries never create the streams)")
	}
	checkSame("k8s", "ALLOT_PARTITIONS", partitions, &problems)
	problems = append(problems, w.checkK8sShards(o)...)
	for _, name := range sortedKeys(o.byKind["ConfigMap"]) {
		if !usedConfigMaps[name] {
			bad("ConfigMap %s: no Deployment or Job loads it", name)
		}
	}
	// The ingest Service reaches the pods' HTTP port.
	svc := o.byKind["Service"]["ingest"]
	ing := deployments["ingest"]
	if svc == nil || ing == nil {
		bad("k8s: want a Deployment and a Service named ingest")
	} else {
		labels := digMap(ing, "spec", "template", "metadata", "labels")
		for k, v := range digMap(svc, "spec", "selector") {
			if labels[k] != v {
				bad("Service ingest: selector %s=%v does not match the ingest pods", k, v)
			}
		}
		c := digList(ing, "spec", "template", "spec", "containers")
		for _, sp := range digList(svc, "spec", "ports") {
			if len(c) == 1 && containerPort(c[0], digStr(sp, "targetPort")) != containerPort(c[0], digStr(c[0], "readinessProbe", "httpGet", "port")) {
				bad("Service ingest: targetPort %s is not the port ingest serves", digStr(sp, "targetPort"))
			}
		}
	}
	return problems
}

// containerPort resolves a probe or Service port (number or name).
func containerPort(c any, port string) string {
	if _, err := strconv.Atoi(port); err == nil {
		return port
	}
	for _, p := range digList(c, "ports") {
		if digStr(p, "name") == port {
			return digStr(p, "containerPort")
		}
	}
	return "?" + port
}

func checkNATSValues(v any) []string {
	var problems []string
	want := map[string]string{
		"config.cluster.enabled":               "true",
		"config.cluster.replicas":              "3",
		"config.jetstream.enabled":             "true",
		"config.jetstream.fileStore.enabled":   "true",
		"config.jetstream.merge.sync_interval": "always",
	}
	for _, k := range sortedKeys(want) {
		if got := digStr(v, strings.Split(k, ".")...); got != want[k] {
			problems = append(problems, fmt.Sprintf("nats-values.yaml: %s is %q, want %q", k, got, want[k]))
		}
	}
	return problems
}

// ---------------------------------------------------------------------------
// Tests

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// k8sManifests reads the manifests kustomization.yaml lists, concatenated.
func k8sManifests(t *testing.T) string {
	t.Helper()
	kust, err := parseYAML(readFile(t, "k8s/kustomization.yaml"))
	if err != nil {
		t.Fatalf("k8s/kustomization.yaml: %v", err)
	}
	var all []string
	for _, r := range strList(dig(kust, "resources")) {
		all = append(all, readFile(t, filepath.Join("k8s", r)))
	}
	files, _ := filepath.Glob("k8s/*.yaml")
	for _, f := range files {
		base := filepath.Base(f)
		if base != "kustomization.yaml" && base != "nats-values.yaml" && !slices.Contains(strList(dig(kust, "resources")), base) {
			t.Errorf("%s is not listed in k8s/kustomization.yaml", f)
		}
	}
	return strings.Join(all, "\n---\n")
}

func report(t *testing.T, problems []string) {
	t.Helper()
	for _, p := range problems {
		t.Error(p)
	}
}

// TestConfigDiscovery guards the discovery itself: if it silently found
// nothing (or everything), every later check would pass vacuously.
func TestConfigDiscovery(t *testing.T) {
	w := loadWorld(t)
	for _, tc := range []struct {
		bin, v string
		want   bool
	}{
		{"ingest", "ALLOT_HTTP_ADDR", true},
		{"ingest", "ALLOT_MYSQL_DSN", true}, // through the embedded config.Common
		{"ingest", "ALLOT_PINNED_TTL", false},
		{"allocator", "ALLOT_PINNED_TTL", true},
		{"allocator", "ALLOT_HTTP_ADDR", false},
		{"notifier", "ALLOT_NOTIFY_URL", true},
		{"loadgen", "ALLOT_HTTP_ADDR", true}, // os.Getenv, through binaries.Getenv
	} {
		b := w.bins[tc.bin]
		if b == nil || b.err != nil {
			t.Fatalf("cmd/%s: missing or unreadable: %v", tc.bin, b)
		}
		if _, got := b.env[tc.v]; got != tc.want {
			t.Errorf("%s reads %s: got %v, want %v", tc.bin, tc.v, got, tc.want)
		}
	}
	if v := w.bins["allocator"].env["ALLOT_PINNED_TTL"]; typeName(v.Type) != "time.Duration" || v.Default == "" {
		t.Errorf("ALLOT_PINNED_TTL: type %v default %q", v.Type, v.Default)
	}
	if !w.bins["loadgen"].flags["url"] || w.bins["loadgen"].flags["no-such-flag"] {
		t.Errorf("loadgen flags: %v", w.bins["loadgen"].flags)
	}
}

func TestDockerfile(t *testing.T) {
	w := loadWorld(t)
	df := readFile(t, "Dockerfile")
	for name := range w.built {
		dir := filepath.Join(w.root, "cmd", name)
		if name == "probe" { // a tool of the image, not a product binary
			dir = filepath.Join(w.root, "internal", "cmd", "probe")
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			t.Errorf("Dockerfile builds %s, but %s is not a directory", name, dir)
		}
	}
	for _, name := range []string{"ingest", "allocator", "notifier", "audit", "loadgen"} {
		if !w.built[name] {
			t.Errorf("Dockerfile does not build %s", name)
		}
	}
	// The image says what it is (OCI annotations), and the binaries are
	// linked with the version and revision of the build arguments, into
	// variables that exist.
	for _, l := range []string{"title", "description", "source", "licenses", "version", "revision", "created"} {
		if !strings.Contains(df, "org.opencontainers.image."+l+"=") {
			t.Errorf("Dockerfile: no org.opencontainers.image.%s label", l)
		}
	}
	bi, err := os.ReadFile(filepath.Join(w.root, "internal", "buildinfo", "buildinfo.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`-X github.com/allot-dev/allot/internal/buildinfo\.([a-z]+)=`).FindAllStringSubmatch(df, -1) {
		if !regexp.MustCompile(`var [a-z, ]*\b` + m[1] + `\b[a-z, ]* string`).Match(bi) {
			t.Errorf("Dockerfile links buildinfo.%s, which internal/buildinfo does not declare as a string var", m[1])
		}
	}
	if !strings.Contains(df, "buildinfo.revision=${REVISION}") {
		t.Error("Dockerfile: the binaries are not linked with the REVISION build argument")
	}
	lines := strings.Split(df, "\n")
	var froms []string
	var user string
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			froms = append(froms, f[1])
		case "USER":
			user = f[1]
		case "ENTRYPOINT":
			t.Errorf("Dockerfile: ENTRYPOINT %q fixes the binary; compose and k8s choose it", l)
		}
	}
	if len(froms) < 2 || !strings.HasPrefix(froms[0], "golang:1.26") {
		t.Errorf("Dockerfile: want a golang:1.26 build stage and a runtime stage, got %v", froms)
	}
	if last := froms[len(froms)-1]; !strings.HasPrefix(last, "gcr.io/distroless/static") && last != "scratch" {
		t.Errorf("Dockerfile: runtime stage %s is not distroless/static or scratch", last)
	}
	if user == "" || user == "root" || strings.HasPrefix(user, "0") {
		t.Errorf("Dockerfile: USER %q, want a non-root user", user)
	}
	if !strings.Contains(df, "CGO_ENABLED=0") {
		t.Error("Dockerfile: CGO_ENABLED=0 missing: the runtime image has no libc")
	}
}

func TestCompose(t *testing.T) {
	w := loadWorld(t)
	doc, err := parseYAML(readFile(t, "compose.yaml"))
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	report(t, w.checkCompose(doc))
	report(t, checkNATS(doc, readFile(t, "nats/nats.conf")))
}

func TestKubernetes(t *testing.T) {
	w := loadWorld(t)
	docs, err := parseYAMLDocs(k8sManifests(t))
	if err != nil {
		t.Fatalf("k8s manifests: %v", err)
	}
	values, err := parseYAML(readFile(t, "k8s/nats-values.yaml"))
	if err != nil {
		t.Fatalf("k8s/nats-values.yaml: %v", err)
	}
	report(t, w.checkK8s(docs, values))
	report(t, checkNATSValues(values))
}

// TestChecksCatchBreakage breaks the real files one way at a time and
// expects the checks to say so: each broken copy fails with the problem it
// was broken for (that the unbroken files pass is TestCompose's and
// TestKubernetes').
func TestChecksCatchBreakage(t *testing.T) {
	w := loadWorld(t)
	compose := readFile(t, "compose.yaml")
	natsConf := readFile(t, "nats/nats.conf")
	manifests := k8sManifests(t)
	values := readFile(t, "k8s/nats-values.yaml")

	run := func(file, src string) ([]string, error) {
		switch file {
		case "compose":
			doc, err := parseYAML(src)
			if err != nil {
				return nil, err
			}
			return append(w.checkCompose(doc), checkNATS(doc, natsConf)...), nil
		case "nats.conf":
			doc, err := parseYAML(compose)
			if err != nil {
				return nil, err
			}
			return checkNATS(doc, src), nil
		case "k8s":
			docs, err := parseYAMLDocs(src)
			if err != nil {
				return nil, err
			}
			v, err := parseYAML(values)
			if err != nil {
				return nil, err
			}
			return w.checkK8s(docs, v), nil
		case "nats-values":
			v, err := parseYAML(src)
			if err != nil {
				return nil, err
			}
			return checkNATSValues(v), nil
		}
		return nil, fmt.Errorf("unknown file %s", file)
	}
	sources := map[string]string{"compose": compose, "nats.conf": natsConf, "k8s": manifests, "nats-values": values}

	for _, tc := range []struct {
		name, file, old, new string
		want                 string // a problem containing this
	}{
		{"misspelled variable", "compose",
			"ALLOT_PINNED_TTL: 5s", "ALLOT_PINNED_TTLL: 5s", "ALLOT_PINNED_TTLL is not read by allocator"},
		{"variable of another binary", "compose",
			"ALLOT_NOTIFY_URL: \"\"", "ALLOT_HTTP_ADDR: \":8080\"", "ALLOT_HTTP_ADDR is not read by notifier"},
		{"value of the wrong type", "compose",
			"ALLOT_PINNED_TTL: 5s", "ALLOT_PINNED_TTL: \"5\"", "is not a valid time.Duration"},
		{"command names no cmd/", "compose",
			"[\"/usr/local/bin/allocator\"]", "[\"/usr/local/bin/alocator\"]", "no cmd/alocator"},
		{"command outside the image's bin", "compose",
			"[\"/usr/local/bin/ingest\"]", "[\"ingest\"]", "is not under /usr/local/bin/"},
		{"invented flag", "compose",
			"\"-users\"", "\"-user\"", "loadgen has no flag -user"},
		{"health check on the wrong port", "compose",
			"http://127.0.0.1:8080/readyz", "http://127.0.0.1:9091/readyz", "ingest serves /readyz on port 8080"},
		{"partitions disagree", "compose",
			"ALLOT_PARTITIONS: \"4\"\n      ALLOT_HTTP_ADDR", "ALLOT_PARTITIONS: \"2\"\n      ALLOT_HTTP_ADDR", "ALLOT_PARTITIONS differs"},
		{"waits on a service without healthcheck", "compose",
			"    healthcheck:\n      test: [\"CMD\", \"wget\"", "    x-healthcheck:\n      test: [\"CMD\", \"wget\"", "nats has no healthcheck"},
		{"allocator does not wait for the migration step", "compose",
			"      migrate:\n        condition: service_completed_successfully\n      setup:\n        condition: service_completed_successfully\n      allocator-1:",
			"      setup:\n        condition: service_completed_successfully\n      allocator-1:",
			"allocator-2: must wait for migrate"},
		{"ingest does not wait for the setup step", "compose",
			"      nats:\n        condition: service_healthy\n      setup:\n        condition: service_completed_successfully\n",
			"      nats:\n        condition: service_healthy\n", "compose service ingest: must wait for setup"},
		{"no setup step", "compose",
			"[\"/usr/local/bin/allotctl\", \"setup\"]", "[\"/usr/local/bin/allocator\", \"-migrate-only\"]", "want one setup step"},
		{"setup step restarted forever", "compose",
			"      ALLOT_STREAM_REPLICAS: \"1\"\n      ALLOT_LOG_LEVEL: info\n    depends_on:\n      nats:\n        condition: service_healthy\n    restart: \"no\"",
			"      ALLOT_STREAM_REPLICAS: \"1\"\n      ALLOT_LOG_LEVEL: info\n    depends_on:\n      nats:\n        condition: service_healthy\n    restart: always",
			"the setup step exits when done"},
		{"stream settings on a runtime binary", "compose",
			"      ALLOT_HTTP_ADDR: \":8080\"", "      ALLOT_HTTP_ADDR: \":8080\"\n      ALLOT_STREAM_REPLICAS: \"1\"", "ALLOT_STREAM_REPLICAS is not read by ingest"},
		{"no setup Job", "k8s", "command: [\"/usr/local/bin/allotctl\", \"setup\"]", "command: [\"/usr/local/bin/allotctl\", \"help\"]", "no Job runs allotctl setup"},
		{"setup Job with other partitions", "k8s", "command: [\"/usr/local/bin/allotctl\", \"setup\"]\n",
			"command: [\"/usr/local/bin/allotctl\", \"setup\"]\n          env:\n            - name: ALLOT_PARTITIONS\n              value: \"2\"\n", "ALLOT_PARTITIONS differs"},
		{"migration step restarted forever", "compose",
			"    restart: \"no\"", "    restart: unless-stopped", "restart \"unless-stopped\" would run it forever"},
		{"no migration step", "compose",
			"[\"/usr/local/bin/allocator\", \"-migrate-only\"]", "[\"/usr/local/bin/allocator\"]", "want one migration step"},
		{"lazy fsync", "nats.conf", "sync_interval: always", "sync_interval: 2m", "sync_interval: always"},
		{"one allocator replica", "k8s", "replicas: 2", "replicas: 1", "want at least 2"},
		{"readiness on /healthz", "k8s", "path: /readyz\n              port: metrics", "path: /healthz\n              port: metrics", "readinessProbe is /healthz"},
		{"readiness on the wrong port", "k8s", "path: /readyz\n              port: metrics", "path: /readyz\n              port: 8080", "want /readyz on port 9091"},
		{"misspelled ConfigMap key", "k8s", "ALLOT_BATCH_WAIT: 2ms", "ALLOT_BATCH_WAITT: 2ms", "ALLOT_BATCH_WAITT is not read by allocator"},
		{"ingest-only key in the shared ConfigMap", "k8s", "ALLOT_LOG_LEVEL: info", "ALLOT_SHED: \"true\"\n  ALLOT_LOG_LEVEL: info", "ALLOT_SHED is not read by allocator"},
		{"missing Secret", "k8s", "metadata:\n  name: allot-allocator\n  labels:\n    app.kubernetes.io/name: allot\n    app.kubernetes.io/component: allocator\ntype: Opaque", "metadata:\n  name: allot-allocator-old\n  labels:\n    app.kubernetes.io/name: allot\n    app.kubernetes.io/component: allocator\ntype: Opaque", "no Secret allot-allocator"},
		{"grace period below shutdown", "k8s", // the first one is ingest's
			"terminationGracePeriodSeconds: 40", "terminationGracePeriodSeconds: 20", "terminationGracePeriodSeconds 20, want more than 25s"},
		{"R1 against a 3-node cluster", "k8s", "ALLOT_STREAM_REPLICAS: \"3\"", "ALLOT_STREAM_REPLICAS: \"1\"", "ALLOT_STREAM_REPLICAS=1"},
		{"lazy fsync on the cluster", "nats-values", "sync_interval: always", "sync_interval: 2m", "sync_interval is \"2m\""},
		// The shards.
		{"a process without the shard list", "compose",
			"ALLOT_MYSQL_SHARDS: s0=allot_audit", "X_MYSQL_SHARDS: s0=allot_audit", "compose service audit: talks to MySQL but sets no ALLOT_MYSQL_SHARDS"},
		{"a shard list that does not parse", "compose",
			"ALLOT_MYSQL_SHARDS: s0=allot_audit", "ALLOT_MYSQL_SHARDS: S0=allot_audit", "has a bad name \"S0\""},
		{"a shard that is no service", "compose",
			"@tcp(mysql-s1:3306)/allot?parseTime=true\n      ALLOT_MYSQL_DSN: allot_ingest", "@tcp(mysql-s2:3306)/allot?parseTime=true\n      ALLOT_MYSQL_DSN: allot_ingest",
			"shard s1 is at mysql-s2:3306, which is not a compose service"},
		{"shards in another order", "compose",
			"ALLOT_MYSQL_SHARDS: s0=allot_allocator:${DB_ALLOCATOR_PASSWORD:-allocator-dev-only}@tcp(mysql-s0:3306)/allot?parseTime=true,s1=allot_allocator:${DB_ALLOCATOR_PASSWORD:-allocator-dev-only}@tcp(mysql-s1:3306)/allot?parseTime=true",
			"ALLOT_MYSQL_SHARDS: s1=allot_allocator:${DB_ALLOCATOR_PASSWORD:-allocator-dev-only}@tcp(mysql-s1:3306)/allot?parseTime=true,s0=allot_allocator:${DB_ALLOCATOR_PASSWORD:-allocator-dev-only}@tcp(mysql-s0:3306)/allot?parseTime=true",
			"every process lists the same shards in the same order"},
		{"a shard as another role's user", "compose",
			"s0=allot_migrate:${DB_MIGRATE_PASSWORD", "s0=allot_allocator:${DB_MIGRATE_PASSWORD", "shard s0 as \"allot_allocator\", want its own user allot_migrate"},
		{"a shard password init-users.sh does not set", "compose",
			"allot_ingest:${DB_INGEST_PASSWORD:-ingest-dev-only}@tcp(mysql-s1", "allot_ingest:${DB_INGEST_PASSWORD:-other}@tcp(mysql-s1", "shard s1's password for allot_ingest"},
		{"one database read that is no shard", "compose",
			"tcp(mysql-s0:3306)/allot?parseTime=true\n      # Bearer", "tcp(mysql-s0:3306)/other?parseTime=true\n      # Bearer", "ALLOT_MYSQL_DSN is none of its shards' DSNs"},
		{"a shard without the init users", "compose",
			"      - mysql-s1-data:/var/lib/mysql\n      - ./mysql/init-users.sh:/docker-entrypoint-initdb.d/10-allot-users.sh:ro\n", "      - mysql-s1-data:/var/lib/mysql\n",
			"compose service mysql-s1: ./mysql/init-users.sh is not mounted"},
		{"a shard without allotctl.sql", "compose",
			"      - ./mysql/allotctl.sql:/allot-mysql/allotctl.sql:ro\n", "", "./mysql/allotctl.sql is not mounted at /allot-mysql/allotctl.sql"},
		{"two shards on one volume", "compose",
			"      - mysql-s1-data:/var/lib/mysql", "      - mysql-s0-data:/var/lib/mysql", "share the data volume mysql-s0-data"},
		{"a process that does not wait for a shard", "compose",
			"      mysql-s1:\n        condition: service_healthy\n      nats:\n        condition: service_healthy\n      setup:\n        condition: service_completed_successfully\n\nvolumes:",
			"      nats:\n        condition: service_healthy\n      setup:\n        condition: service_completed_successfully\n\nvolumes:",
			"compose service audit: does not wait for shard s1"},
		{"a MySQL service that is no shard", "compose",
			"  nats:\n    image: nats", "  mysql-s9:\n    image: mysql:8.4\n  nats:\n    image: nats", "compose service mysql-s9 runs MySQL but is no shard"},
		{"a k8s Secret without the shard list", "k8s",
			"  ALLOT_MYSQL_SHARDS: s0=allot_ingest", "  # ALLOT_MYSQL_SHARDS: s0=allot_ingest", "Deployment ingest container ingest: talks to MySQL but sets no ALLOT_MYSQL_SHARDS"},
		{"k8s shards named otherwise", "k8s",
			"ALLOT_MYSQL_SHARDS: s0=allot_allotctl:", "ALLOT_MYSQL_SHARDS: s2=allot_allotctl:", "every process lists the same shards in the same order"},
		{"a k8s shard at another address", "k8s",
			"s1=allot_migrate:CHANGE-ME@tcp(mysql-s1.example.internal", "s1=allot_migrate:CHANGE-ME@tcp(mysql-s0.example.internal", "shards s0 and s1 are the same database"},
		{"the migration init container as the allocator's user", "k8s",
			"s0=allot_migrate:", "s0=allot_allocator:", "Deployment allocator container migrate: shard s0 as \"allot_allocator\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := sources[tc.file]
			if tc.old == "" || !strings.Contains(src, tc.old) {
				t.Fatalf("the %s files no longer contain %q: update this case", tc.file, tc.old)
			}
			src = strings.Replace(src, tc.old, tc.new, 1)
			problems, err := run(tc.file, src)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			t.Logf("problems: %q", problems)
			for _, p := range problems {
				if strings.Contains(p, tc.want) {
					return
				}
			}
			t.Fatalf("no problem mentions %q; got %q", tc.want, problems)
		})
	}
}

// TestYAMLReading pins down how the files are read (go.yaml.in/yaml/v3 into
// plain values): scalars as written, lists, mappings, null, and what a YAML
// parser refuses.
func TestYAMLReading(t *testing.T) {
	src := `# comment
a: 1 # trailing
b:
  c: "x # not a comment"
  d: ['p', "q r", s]
list:
- name: one
  env:
    - X=1
- two
e: {}
f:
g: 'it''s'
`
	v, err := parseYAML(src)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"a": "1", "b.c": "x # not a comment", "g": "it's"} {
		if got := digStr(v, strings.Split(path, ".")...); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}
	if got := strList(dig(v, "b", "d")); !slices.Equal(got, []string{"p", "q r", "s"}) {
		t.Errorf("b.d = %q", got)
	}
	l := digList(v, "list")
	if len(l) != 2 || digStr(l[0], "name") != "one" || strList(dig(l[0], "env"))[0] != "X=1" || l[1] != "two" {
		t.Errorf("list = %#v", l)
	}
	if digMap(v, "e") == nil || dig(v, "f") != nil {
		t.Errorf("e = %#v, f = %#v", dig(v, "e"), dig(v, "f"))
	}
	docs, err := parseYAMLDocs("a: 1\n---\nb: 2\n")
	if err != nil || len(docs) != 2 {
		t.Errorf("two documents: %v, %v", docs, err)
	}

	// Anchors, merge keys and block scalars are YAML, and read as such.
	v, err = parseYAML("base: &b {x: 1}\nuse:\n  <<: *b\n  y: 2\ntext: |\n  two\n  lines\n")
	if err != nil || digStr(v, "use", "x") != "1" || digStr(v, "use", "y") != "2" || digStr(v, "text") != "two\nlines\n" {
		t.Errorf("anchors, merge keys, block scalars: %#v, %v", v, err)
	}

	for _, bad := range []struct{ name, src string }{
		{"tab indentation", "a:\n\tb: 1\n"},
		{"unknown alias", "a: *x\n"},
		{"duplicate key", "a: 1\na: 2\n"},
		{"bad indentation", "a:\n    b: 1\n  c: 2\n"},
		{"unquoted colon-space", "a: b: c\n"},
		{"unterminated quote", "a: \"b\n"},
	} {
		if _, err := parseYAMLDocs(bad.src); err == nil {
			t.Errorf("%s: parsed %q without error", bad.name, bad.src)
		}
	}
}
