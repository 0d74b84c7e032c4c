package deploy

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/allot-dev/allot/internal/allocator"
	"github.com/allot-dev/allot/internal/allocator/health"
	"github.com/allot-dev/allot/internal/buildinfo"
	"github.com/allot-dev/allot/internal/bus"
	"github.com/allot-dev/allot/internal/config"
	"github.com/allot-dev/allot/internal/dbtest"
	"github.com/allot-dev/allot/internal/ingest"
	"github.com/allot-dev/allot/internal/natstest"
	"github.com/allot-dev/allot/internal/notifier"
)

// recorder is a Registerer that remembers every metric described to it:
// its name and label names. Describe, unlike Gather, lists a vector that
// has no series yet.
type recorder struct {
	*prometheus.Registry
	mu     sync.Mutex
	labels map[string][]string // metric name → its label names
}

var (
	descName   = regexp.MustCompile(`fqName: "([^"]+)"`)
	descConst  = regexp.MustCompile(`constLabels: \{([^}]*)\}`)
	descVar    = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	labelNames = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)`)
)

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		s := d.String()
		m := descName.FindStringSubmatch(s)
		if m == nil {
			continue
		}
		var labels []string
		if c := descConst.FindStringSubmatch(s); c != nil {
			for _, kv := range strings.Split(c[1], ",") {
				if name, _, ok := strings.Cut(kv, "="); ok {
					labels = append(labels, strings.TrimSpace(name))
				}
			}
		}
		if v := descVar.FindStringSubmatch(s); v != nil {
			labels = append(labels, labelNames.FindAllString(v[1], -1)...)
		}
		r.mu.Lock()
		r.labels[m[1]] = labels
		r.mu.Unlock()
	}
	return r.Registry.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// registeredMetrics builds ingest, the allocator and the notifier with
// their real constructors (not started) on a recorder and returns what they
// registered, and the recorder to gather from.
func registeredMetrics(t *testing.T) *recorder {
	t.Helper()
	rec := &recorder{Registry: prometheus.NewRegistry(), labels: map[string][]string{}}
	db := dbtest.New(t)
	ns := natstest.New(t)
	ns.Setup(t, config.Defaults[bus.Config]())
	nc, js := ns.Connect(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := ingest.New(config.Defaults[ingest.Config](), ingest.Deps{DB: db.DB, NATS: nc, JS: js, Log: log, Registry: rec, Gatherer: rec.Registry}); err != nil {
		t.Fatal(err)
	}
	if _, err := allocator.New(config.Defaults[allocator.Config](), allocator.Deps{DB: db.DB, NATS: nc, Log: log, Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := notifier.New(config.Defaults[notifier.Config](), notifier.Deps{NC: nc, Log: log, Registry: rec}); err != nil {
		t.Fatal(err)
	}
	// What each binary's Run adds to the constructors' metrics.
	rec.MustRegister(buildinfo.Collector(), health.New(map[string]*sql.DB{"default": db.DB}, nc).ShardUp())
	if len(rec.labels) < 10 {
		t.Fatalf("only %d metrics recorded: the recorder no longer reads Desc", len(rec.labels))
	}
	return rec
}

// series are what Prometheus itself adds, not the binaries.
var prometheusOwn = map[string]bool{"up": true}

// metricRef is one metric named in an expression, with the labels its
// selector matches on.
type metricRef struct {
	name   string
	labels map[string]string // label → value of an = matcher, "" for others
}

var (
	selector = regexp.MustCompile(`\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{([^}]*)\})?`)
	matcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
)

// metricsIn extracts the allot_ metrics (and up) an expression selects.
func metricsIn(expr string) []metricRef {
	var out []metricRef
	for _, m := range selector.FindAllStringSubmatch(expr, -1) {
		if !strings.HasPrefix(m[1], "allot_") && !prometheusOwn[m[1]] {
			continue
		}
		ref := metricRef{name: m[1], labels: map[string]string{}}
		for _, lm := range matcher.FindAllStringSubmatch(m[3], -1) {
			v := ""
			if lm[2] == "=" {
				v = lm[3]
			}
			ref.labels[lm[1]] = v
		}
		out = append(out, ref)
	}
	return out
}

// checkRef reports a metric the binaries do not register, a label it does
// not have, or an = matcher on a value none of its pre-created series has.
func checkRef(rec *recorder, where string, ref metricRef) []string {
	var problems []string
	if prometheusOwn[ref.name] {
		return nil
	}
	name := ref.name
	labels, ok := rec.labels[name]
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, cut := strings.CutSuffix(name, suffix); !ok && cut {
			name = base
			labels, ok = rec.labels[base]
			if suffix == "_bucket" {
				labels = append(slices.Clone(labels), "le")
			}
		}
	}
	if !ok {
		return []string{fmt.Sprintf("%s: metric %s is not registered by ingest, the allocator or the notifier", where, ref.name)}
	}
	families, err := rec.Registry.Gather()
	if err != nil {
		return []string{err.Error()}
	}
	for label, value := range ref.labels {
		if !slices.Contains(labels, label) {
			problems = append(problems, fmt.Sprintf("%s: metric %s has no label %q (it has %v)", where, ref.name, label, labels))
			continue
		}
		if value == "" {
			continue
		}
		var seen []string
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == label {
						seen = append(seen, lp.GetValue())
					}
				}
			}
		}
		if len(seen) > 0 && !slices.Contains(seen, value) {
			problems = append(problems, fmt.Sprintf("%s: %s{%s=%q}: the binary's series have %s in %v", where, ref.name, label, value, label, seen))
		}
	}
	return problems
}

// alertRules is deploy/prometheus/alerts.yaml.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestAlertRules: the rules parse, each has an expression, a severity and a
// summary, the alerts the operators were promised exist, and every metric
// and label they name is one the binaries register.
func TestAlertRules(t *testing.T) {
	data, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules alertRules
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("prometheus/alerts.yaml: %v", err)
	}
	rec := registeredMetrics(t)
	covered := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			where := "alert " + r.Alert
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("%s: a rule needs alert and expr", where)
			}
			if s := r.Labels["severity"]; s != "page" && s != "warn" {
				t.Errorf("%s: severity %q, want page or warn", where, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: needs a summary and a description", where)
			}
			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") {
				t.Errorf("%s: unbalanced parentheses in %q", where, r.Expr)
			}
			refs := metricsIn(r.Expr)
			if len(refs) == 0 {
				t.Errorf("%s: names no allot metric", where)
			}
			for _, ref := range refs {
				for _, p := range checkRef(rec, where, ref) {
					t.Error(p)
				}
				covered[ref.name] = true
			}
		}
	}
	// What operators are promised (docs/operations.md): allocator lag, outbox backlog,
	// dead letters, publish failures and the 5xx rate.
	for _, m := range []string{"allot_allocator_consumer_pending_messages", "allot_allocator_outbox_backlog_requests",
		"allot_notifier_deliveries_total", "allot_ingest_publish_failures_total", "allot_ingest_http_requests_total"} {
		if !covered[m] {
			t.Errorf("no alert watches %s", m)
		}
	}
	// And an allocator that is alive but cannot commit.
	if !covered["allot_allocator_partition_stalled"] {
		t.Error("no alert watches allot_allocator_partition_stalled")
	}
}

// TestGrafanaDashboard: the dashboard is JSON Grafana can import, every
// panel has a query, and every metric and label the queries name is one the
// binaries register.
func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile("grafana/allot.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
			GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana/allot.json: %v", err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatal("the dashboard needs a title, a uid and panels")
	}
	rec := registeredMetrics(t)
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		where := "panel " + p.Title
		if ids[p.ID] {
			t.Errorf("%s: id %d used twice", where, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W == 0 || p.GridPos.H == 0 || len(p.Targets) == 0 {
			t.Errorf("%s: needs a size and a query", where)
		}
		for _, tg := range p.Targets {
			refs := metricsIn(tg.Expr)
			if len(refs) == 0 {
				t.Errorf("%s: %q names no allot metric", where, tg.Expr)
			}
			for _, ref := range refs {
				for _, p := range checkRef(rec, where, ref) {
					t.Error(p)
				}
			}
		}
	}
}

// TestMetricsInFindsWhatItMust keeps the extraction honest: a misspelt
// metric or label must be caught.
func TestMetricsInFindsWhatItMust(t *testing.T) {
	refs := metricsIn(`sum(rate(allot_ingest_http_requests_total{code=~"5..", route="x"}[5m])) / up{job="allot"}`)
	if len(refs) != 2 || refs[0].name != "allot_ingest_http_requests_total" || refs[0].labels["route"] != "x" ||
		refs[0].labels["code"] != "" || refs[1].name != "up" {
		t.Fatalf("metricsIn = %+v", refs)
	}
	rec := registeredMetrics(t)
	for _, bad := range []metricRef{
		{name: "allot_ingest_http_request_total", labels: map[string]string{}},
		{name: "allot_ingest_http_requests_total", labels: map[string]string{"status": ""}},
		{name: "allot_notifier_deliveries_total", labels: map[string]string{"result": "deadlettered"}},
	} {
		if len(checkRef(rec, "test", bad)) == 0 {
			t.Errorf("checkRef accepted %+v", bad)
		}
	}
	good := metricRef{name: "allot_allocator_accept_to_apply_seconds_bucket", labels: map[string]string{"le": "", "partition": ""}}
	if p := checkRef(rec, "test", good); len(p) != 0 {
		t.Errorf("checkRef refused %+v: %v", good, p)
	}
}
