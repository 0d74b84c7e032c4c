// Package devdb makes sure a MySQL-compatible server answers for the
// development commands (`make run`, `make test`, `.ci/run`): the server of
// the configured DSN when it answers, else a private server started from
// the installed mariadbd or mysqld with its data under ./var/mysql, else,
// on Debian or Ubuntu as root, one installed with apt-get; otherwise it
// names, in one line, the command that installs one on this platform.
//
// The decision is a pure function of what was found on the machine
// (Decide), so every branch is tested without a machine in that state.
package devdb

import (
	"fmt"
)

// Probe is what connecting to a DSN's server found.
type Probe int

// The outcomes of a probe.
const (
	// Unreachable: nothing answered (refused, timed out, no such host).
	Unreachable Probe = iota
	// Refused: a server answered but refused the login or the query
	// (Debian's root over unix_socket only, a wrong password).
	Refused
	// Answers: the server accepted the login and ran a query.
	Answers
)

func (p Probe) String() string {
	switch p {
	case Answers:
		return "answers"
	case Refused:
		return "refused the login"
	default:
		return "unreachable"
	}
}

// Situation is what Ensure found on this machine before deciding.
type Situation struct {
	// DSN is the probe of the configured DSN's server.
	DSN Probe
	// Explicit is true when the user set the DSN (its variable is set),
	// false when it is the default.
	Explicit bool
	// Private is the probe of a private server that an earlier command
	// left running from the data directory (Unreachable when none).
	Private Probe
	// Server is the path of an installed mariadbd or mysqld, "" if none.
	Server string
	// GOOS is runtime.GOOS.
	GOOS string
	// Apt is true on Debian or Ubuntu (apt-get is installed).
	Apt bool
	// Root is true when the process runs as root (uid 0).
	Root bool
	// MayInstall allows installing a server with apt-get.
	MayInstall bool
}

// Action is what Ensure does about a Situation.
type Action int

// The actions, in the order they are preferred.
const (
	// UseDSN: the configured server answers; use it as it is.
	UseDSN Action = iota
	// ReusePrivate: a private server from the data directory is running
	// (another make run, say); use it and leave it running.
	ReusePrivate
	// StartPrivate: start a private server from Situation.Server.
	StartPrivate
	// Install: install mariadb-server with apt-get, then look again.
	Install
	// Advise: nothing can be done here; say what to run, and fail.
	Advise
	// Fail: the user's own DSN answers but refuses the login; starting
	// another server would hide a mistake in their setting.
	Fail
)

func (a Action) String() string {
	return [...]string{"use the DSN's server", "reuse the private server", "start a private server",
		"install mariadb-server", "advise", "fail"}[a]
}

// Decide chooses what to do. A DSN the user set that answers but refuses
// the login is an error of theirs, reported rather than worked around; the
// default DSN refusing (Debian's root is unix_socket only) is treated like
// no server at all.
func Decide(s Situation) Action {
	switch {
	case s.DSN == Answers:
		return UseDSN
	case s.DSN == Refused && s.Explicit:
		return Fail
	case s.Private == Answers:
		return ReusePrivate
	case s.Server != "":
		return StartPrivate
	case s.MayInstall && s.Apt && s.Root && s.GOOS == "linux":
		return Install
	default:
		return Advise
	}
}

// Advice is the one line that names the command to install a server on the
// platform of s.
func Advice(s Situation) string {
	const compose = "or run one in a container: docker compose -f deploy/compose.yaml up -d mysql-s0, and set ALLOT_MYSQL_DSN"
	var install string
	switch {
	case s.GOOS == "darwin":
		install = "brew install mariadb"
	case s.Apt && s.Root:
		install = "apt-get install mariadb-server"
	case s.Apt:
		install = "sudo apt-get install mariadb-server"
	case s.GOOS == "linux":
		install = "install the mariadb-server package of your distribution (dnf install mariadb-server, apk add mariadb, pacman -S mariadb)"
	default:
		install = "install MariaDB 10.11+ or MySQL 8"
	}
	return fmt.Sprintf("no MySQL-compatible server answers and none is installed: %s (then run this again; it starts a private one under var/mysql), %s", install, compose)
}
