package deploy

// The shards of the deployment files: every process that talks to MySQL
// (the allocator and its migration step, ingest, the audit, allotctl) has
// the shard list ALLOT_MYSQL_SHARDS, every list names the same shards in
// the same order (the setup step seeds partition p on the (p mod N)-th),
// each process connects to every shard as its own least-privilege user, and
// in compose every shard is a MySQL service of its own (its own volume)
// that creates those users at its first start (deploy/mysql).

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/allot-dev/allot/internal/shards"
)

// mysqlRole is the MySQL user (allot_<role>, deploy/mysql) each binary that
// talks to MySQL connects as; the migration step is the allocator run with
// -migrate-only.
func mysqlRole(b *binary, cmd []string) string {
	switch {
	case b.name == "allocator" && slices.Contains(cmd, "-migrate-only"):
		return "migrate"
	case b.name == "allocator", b.name == "ingest", b.name == "audit", b.name == "allotctl":
		return b.name
	}
	return ""
}

// mysqlUsers are what deploy/mysql creates: each user's password variable
// of init-users.sh (the container's environment), by user name.
type mysqlUsers map[string]string

// loadMySQLUsers reads deploy/mysql: the users the SQL files create and the
// variable init-users.sh sets each one's password from. A user without a
// password variable, or a variable without a user, is a problem.
func loadMySQLUsers(root string) (mysqlUsers, []string) {
	var problems []string
	dir := filepath.Join(root, "deploy", "mysql")
	script, err := os.ReadFile(filepath.Join(dir, "init-users.sh"))
	if err != nil {
		return nil, []string{err.Error()}
	}
	// @<role>_password = '${VAR}'
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`@([a-z]+)_password = '\$\{([A-Z0-9_]+)\}'`).FindAllStringSubmatch(string(script), -1) {
		vars[m[1]] = m[2]
	}
	users := mysqlUsers{}
	for _, f := range sourcedSQL(string(script)) {
		sql, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			problems = append(problems, fmt.Sprintf("init-users.sh sources %s: %v", f, err))
			continue
		}
		for _, m := range regexp.MustCompile(`CREATE USER IF NOT EXISTS ''allot_([a-z]+)''`).FindAllStringSubmatch(string(sql), -1) {
			v, ok := vars[m[1]]
			if !ok {
				problems = append(problems, fmt.Sprintf("mysql/%s creates allot_%s, but init-users.sh sets no @%s_password", f, m[1], m[1]))
				continue
			}
			users["allot_"+m[1]] = v
		}
	}
	return users, problems
}

// sourcedSQL are the SQL files init-users.sh feeds the server, as mounted
// under /allot-mysql/ (deploy/mysql/<name>).
func sourcedSQL(script string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`\$\(cat /allot-mysql/([a-z0-9_-]+\.sql)\)`).FindAllStringSubmatch(script, -1) {
		out = append(out, m[1])
	}
	return out
}

// shardList is one process's parsed ALLOT_MYSQL_SHARDS.
type shardList struct {
	where string
	names []string
	dsns  map[string]*mysql.Config // by shard name, compose defaults applied
	raw   map[string]string        // by shard name, as written
}

// parseShardList checks a process's shard list: set, parses, and every DSN
// is its role's user; ALLOT_MYSQL_DSN (what still reads one database uses
// it), when set, is one of the shards' DSNs.
func parseShardList(p process, role string, users mysqlUsers, problems *[]string) *shardList {
	bad := func(format string, args ...any) {
		*problems = append(*problems, p.where+": "+fmt.Sprintf(format, args...))
	}
	v, ok := p.env["ALLOT_MYSQL_SHARDS"]
	if !ok || strings.TrimSpace(v) == "" {
		bad("talks to MySQL but sets no ALLOT_MYSQL_SHARDS: every process that talks to MySQL lists every shard")
		return nil
	}
	set, err := shards.Parse(composeDefaults.ReplaceAllString(v, "$1"), "root@tcp(127.0.0.1:3306)/allot")
	if err != nil {
		bad("%v", err)
		return nil
	}
	l := &shardList{where: p.where, names: set.Names(), dsns: map[string]*mysql.Config{}, raw: map[string]string{}}
	for _, entry := range strings.Split(v, ",") {
		name, d, _ := strings.Cut(strings.TrimSpace(entry), "=")
		l.raw[name] = d
	}
	want := "allot_" + role
	if _, ok := users[want]; !ok {
		bad("its MySQL user would be %s, which deploy/mysql does not create", want)
	}
	for _, sh := range set.Shards() {
		cfg, _ := mysql.ParseDSN(sh.DSN) // Parse checked it
		l.dsns[sh.Name] = cfg
		if cfg.User != want {
			bad("shard %s as %q, want its own user %s", sh.Name, cfg.User, want)
		}
	}
	if d, ok := p.env["ALLOT_MYSQL_DSN"]; ok {
		found := false
		for _, name := range l.names {
			found = found || l.raw[name] == d
		}
		if !found {
			bad("ALLOT_MYSQL_DSN is none of its shards' DSNs: what reads one database must read a shard")
		}
	}
	return l
}

// checkSameShards checks that every list names the same shards, in the same
// order, each at the same address and database.
func checkSameShards(where string, lists []*shardList, problems *[]string) {
	if len(lists) == 0 {
		return
	}
	first := lists[0]
	for _, l := range lists[1:] {
		if !slices.Equal(l.names, first.names) {
			*problems = append(*problems, fmt.Sprintf("%s: ALLOT_MYSQL_SHARDS lists %v in %s but %v in %s: every process lists the same shards in the same order (setup seeds partition p on the (p mod N)-th)",
				where, first.names, first.where, l.names, l.where))
			continue
		}
		for _, n := range l.names {
			a, b := first.dsns[n], l.dsns[n]
			if a.Addr != b.Addr || a.DBName != b.DBName {
				*problems = append(*problems, fmt.Sprintf("%s: shard %s is %s/%s in %s but %s/%s in %s", where, n, a.Addr, a.DBName, first.where, b.Addr, b.DBName, l.where))
			}
		}
	}
	seen := map[string]string{}
	for _, n := range first.names {
		at := first.dsns[n].Addr + "/" + first.dsns[n].DBName
		if other, dup := seen[at]; dup {
			*problems = append(*problems, fmt.Sprintf("%s: shards %s and %s are the same database %s", where, other, n, at))
		}
		seen[at] = n
	}
}

// checkComposeShards checks the shard lists of the compose services and
// that each shard is a MySQL service of the file with the init users.
func (w *world) checkComposeShards(services map[string]any) []string {
	users, problems := loadMySQLUsers(w.root)
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var lists []*shardList
	for _, name := range sortedKeys(services) {
		svc := services[name]
		env := allotEnv(digMap(svc, "environment"))
		cmd := strList(dig(svc, "command"))
		if len(cmd) == 0 || !strings.HasPrefix(cmd[0], binDir) {
			continue
		}
		b := w.bins[strings.TrimPrefix(cmd[0], binDir)]
		if b == nil || b.err != nil {
			continue // checkCompose says so
		}
		role := mysqlRole(b, cmd)
		if role == "" {
			if _, ok := env["ALLOT_MYSQL_SHARDS"]; ok {
				bad("compose service %s: sets ALLOT_MYSQL_SHARDS, but %s never talks to MySQL", name, b.name)
			}
			continue
		}
		where := "compose service " + name
		l := parseShardList(process{where: where, cmd: cmd, env: env}, role, users, &problems)
		if l == nil {
			continue
		}
		lists = append(lists, l)
		for _, n := range l.names {
			host, _, _ := strings.Cut(l.dsns[n].Addr, ":")
			shardSvc, ok := services[host]
			if !ok {
				bad("%s: shard %s is at %s, which is not a compose service", where, n, l.dsns[n].Addr)
				continue
			}
			// The setup step only names the shards (it seeds the map).
			if !isSetup(b, process{cmd: cmd}) && !dependsOn(services, name, host, map[string]bool{}) {
				bad("%s: does not wait for shard %s (service %s) to be healthy, directly or through what it waits for", where, n, host)
			}
			// The DSN's password is the one init-users.sh gives the user on
			// that service: the same ${VAR:-default} in both.
			pw := dsnPassword(l.raw[n])
			if v := users[l.dsns[n].User]; v != "" && digStr(shardSvc, "environment", v) != pw {
				bad("%s: shard %s's password for %s is %q, but service %s creates it with %s=%q", where, n, l.dsns[n].User, pw, host, v, digStr(shardSvc, "environment", v))
			}
		}
	}
	checkSameShards("compose", lists, &problems)
	// Every MySQL service is a shard of the lists, each with the init users
	// and a data volume of its own.
	listed := map[string]bool{}
	if len(lists) > 0 {
		for _, n := range lists[0].names {
			host, _, _ := strings.Cut(lists[0].dsns[n].Addr, ":")
			listed[host] = true
		}
	}
	volumes := map[string]string{}
	for _, name := range sortedKeys(services) {
		svc := services[name]
		if !strings.HasPrefix(digStr(svc, "image"), "mysql:") {
			continue
		}
		if !listed[name] {
			bad("compose service %s runs MySQL but is no shard of ALLOT_MYSQL_SHARDS", name)
			continue
		}
		if img := digStr(svc, "image"); !strings.HasPrefix(img, "mysql:8.4") {
			bad("compose service %s: image %q, want mysql:8.4", name, img)
		}
		if digMap(svc, "healthcheck") == nil {
			bad("compose service %s: no healthcheck (the processes wait for every shard to be healthy)", name)
		}
		if digStr(svc, "environment", "MYSQL_DATABASE") != "allot" {
			bad("compose service %s: MYSQL_DATABASE %q, want allot (the database of the shard DSNs)", name, digStr(svc, "environment", "MYSQL_DATABASE"))
		}
		mounts := map[string]string{} // container path → host path
		for _, v := range strList(dig(svc, "volumes")) {
			parts := strings.Split(v, ":")
			if len(parts) < 2 {
				continue
			}
			mounts[parts[1]] = parts[0]
			if parts[1] == "/var/lib/mysql" {
				if other, dup := volumes[parts[0]]; dup {
					bad("compose services %s and %s share the data volume %s: each shard needs its own", other, name, parts[0])
				}
				volumes[parts[0]] = name
			}
		}
		if mounts["/var/lib/mysql"] == "" {
			bad("compose service %s: no data volume at /var/lib/mysql", name)
		}
		init := false
		for path, src := range mounts {
			init = init || (src == "./mysql/init-users.sh" && strings.HasPrefix(path, "/docker-entrypoint-initdb.d/"))
		}
		if !init {
			bad("compose service %s: ./mysql/init-users.sh is not mounted in /docker-entrypoint-initdb.d/: the shard would have no allot users", name)
		}
		script, _ := os.ReadFile(filepath.Join(w.root, "deploy", "mysql", "init-users.sh"))
		for _, f := range sourcedSQL(string(script)) {
			if mounts["/allot-mysql/"+f] != "./mysql/"+f {
				bad("compose service %s: ./mysql/%s is not mounted at /allot-mysql/%s, which init-users.sh reads", name, f, f)
			}
		}
		for _, u := range sortedKeys(users) {
			if digStr(svc, "environment", users[u]) == "" {
				bad("compose service %s: no %s, the password init-users.sh gives %s", name, users[u], u)
			}
		}
	}
	return problems
}

// dependsOn reports whether service from waits for target to be healthy,
// itself or through a service it waits for.
func dependsOn(services map[string]any, from, target string, seen map[string]bool) bool {
	if seen[from] {
		return false
	}
	seen[from] = true
	for _, dep := range sortedKeys(digMap(services[from], "depends_on")) {
		cond := digStr(services[from], "depends_on", dep, "condition")
		if dep == target && cond == "service_healthy" {
			return true
		}
		if dependsOn(services, dep, target, seen) {
			return true
		}
	}
	return false
}

// dsnPassword is the password of a DSN as written (compose interpolation
// left in).
func dsnPassword(dsn string) string {
	at := strings.LastIndex(dsn, "@tcp(")
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(dsn[:at], ":")
	return pw
}

// checkK8sShards checks the shard lists every Kubernetes container that
// talks to MySQL (init containers too: the migration step) gets from its
// Secrets and ConfigMaps.
func (w *world) checkK8sShards(o k8sObjects) []string {
	users, problems := loadMySQLUsers(w.root)
	var lists []*shardList
	for _, kind := range []string{"Deployment", "Job"} {
		for _, name := range sortedKeys(o.byKind[kind]) {
			spec := dig(o.byKind[kind][name], "spec", "template", "spec")
			for _, group := range []string{"initContainers", "containers"} {
				for _, c := range digList(spec, group) {
					p := process{where: fmt.Sprintf("%s %s container %s", kind, name, digStr(c, "name")), cmd: strList(dig(c, "command")), env: containerEnv(o, c)}
					if len(p.cmd) == 0 {
						continue
					}
					b := w.bins[strings.TrimPrefix(p.cmd[0], binDir)]
					if b == nil || b.err != nil {
						continue // checkK8s says so
					}
					role := mysqlRole(b, p.cmd)
					if role == "" {
						continue
					}
					if l := parseShardList(p, role, users, &problems); l != nil {
						lists = append(lists, l)
					}
				}
			}
		}
	}
	checkSameShards("k8s", lists, &problems)
	return problems
}

// containerEnv is the ALLOT_ environment a container gets from envFrom and
// env (values and references); what cannot be read is left out (checkK8s
// reports it).
func containerEnv(o k8sObjects, c any) map[string]string {
	env := map[string]string{}
	for _, ef := range digList(c, "envFrom") {
		kind, ref := "ConfigMap", digStr(ef, "configMapRef", "name")
		if ref == "" {
			kind, ref = "Secret", digStr(ef, "secretRef", "name")
		}
		data, _ := o.keys(kind, ref)
		for k, v := range data {
			env[k] = v
		}
	}
	for _, e := range digList(c, "env") {
		name, v := digStr(e, "name"), digStr(e, "value")
		for kind, refKey := range map[string]string{"ConfigMap": "configMapKeyRef", "Secret": "secretKeyRef"} {
			if ref := digMap(e, "valueFrom", refKey); ref != nil {
				data, _ := o.keys(kind, digStr(ref, "name"))
				v = data[digStr(ref, "key")]
			}
		}
		if strings.HasPrefix(name, "ALLOT_") {
			env[name] = v
		}
	}
	return env
}
