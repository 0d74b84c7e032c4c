package config

import (
	"reflect"
	"testing"
	"time"

	"github.com/kelseyhightower/envconfig"
)

type DefaultsInner struct {
	Wait time.Duration `envconfig:"DEFAULTS_TEST_WAIT" default:"250ms"`
	On   bool          `envconfig:"DEFAULTS_TEST_ON" default:"true"`
}

type defaultsSpec struct {
	Name  string  `envconfig:"DEFAULTS_TEST_NAME" default:"x"`
	N     int     `envconfig:"DEFAULTS_TEST_N" default:"-3"`
	Rate  float64 `envconfig:"DEFAULTS_TEST_RATE" default:"0.5"`
	Bare  string  `envconfig:"DEFAULTS_TEST_BARE"`
	Size  uint16  `envconfig:"DEFAULTS_TEST_SIZE" default:"512"`
	inner int
	DefaultsInner
}

// Defaults must leave a struct exactly as envconfig does in an environment
// that sets none of its variables.
func TestDefaultsEqualsEnvconfigWithNothingSet(t *testing.T) {
	var want defaultsSpec
	if err := envconfig.Process("ALLOT_DEFAULTS_TEST_UNSET", &want); err != nil {
		t.Fatal(err)
	}
	got := Defaults[defaultsSpec]()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Defaults = %+v, envconfig = %+v", got, want)
	}
	if got.Wait != 250*time.Millisecond || !got.On || got.N != -3 {
		t.Fatalf("defaults not applied: %+v", got)
	}
}

// A variable in the environment does not leak into Defaults.
func TestDefaultsReadNoEnvironment(t *testing.T) {
	t.Setenv("DEFAULTS_TEST_NAME", "from-env")
	t.Setenv("ALLOT_DEFAULTS_TEST_NAME", "from-env")
	if got := Defaults[defaultsSpec]().Name; got != "x" {
		t.Fatalf("Name = %q, want the tag's default", got)
	}
}
