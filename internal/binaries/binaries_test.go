package binaries

import (
	"reflect"
	"testing"
	"time"
)

type Inner struct {
	A string `envconfig:"A_VAR" default:"a"`
}

type sample struct {
	Inner
	Named      Inner
	MaxConns   int    `split_words:"true" default:"3"`
	HTTPAddr   string `split_words:"true"`
	Plain      time.Duration
	Skipped    string `envconfig:"SKIPPED" ignored:"true"`
	unexported string //nolint:unused // envconfig and Vars skip it
	Again      string `envconfig:"A_VAR" default:"other"`
}

func TestVars(t *testing.T) {
	var got []string
	defs := map[string]string{}
	for _, v := range Vars(sample{}) {
		got = append(got, v.Name)
		if v.HasDefault {
			defs[v.Name] = v.Default
		}
	}
	want := []string{"ALLOT_A_VAR", "ALLOT_NAMED_A_VAR", "ALLOT_MAX_CONNS", "ALLOT_HTTP_ADDR", "ALLOT_PLAIN"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Vars = %v, want %v", got, want)
	}
	if defs["ALLOT_A_VAR"] != "a" || defs["ALLOT_MAX_CONNS"] != "3" {
		t.Errorf("defaults %v", defs)
	}
	if n := len(Vars(Ingest{})); n < 20 {
		t.Errorf("Ingest has only %d variables", n)
	}
}

func TestGetenvNoFallback(t *testing.T) {
	t.Setenv("TOKEN", "unprefixed")
	t.Setenv("ALLOT_AUTH_ISSUER", "iss")
	l := Getenv[Loadgen]()
	if l.Token != "" || l.AuthIssuer != "iss" {
		t.Errorf("Getenv = %+v", l)
	}
}
