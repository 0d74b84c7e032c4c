package config

import (
	"fmt"
	"reflect"
	"strconv"
	"time"
)

// Defaults returns a T whose fields hold their `default` tags, as Load
// would leave them in an empty environment, and nothing else: the one place
// defaults live is the envconfig struct, and tests (or a launcher that
// overrides a few fields) start from this instead of restating them. It
// reads no environment variable. It panics on a default tag it cannot
// parse, which is a bug in the struct.
func Defaults[T any]() T {
	var v T
	if err := setDefaults(reflect.ValueOf(&v).Elem()); err != nil {
		panic(fmt.Sprintf("config.Defaults[%T]: %v", v, err))
	}
	return v
}

var durationType = reflect.TypeFor[time.Duration]()

func setDefaults(v reflect.Value) error {
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		if !f.IsExported() {
			continue
		}
		if f.Type.Kind() == reflect.Struct && f.Type != durationType {
			if err := setDefaults(fv); err != nil {
				return err
			}
			continue
		}
		def, ok := f.Tag.Lookup("default")
		if !ok {
			continue
		}
		if err := setField(fv, def); err != nil {
			return fmt.Errorf("field %s: default %q: %w", f.Name, def, err)
		}
	}
	return nil
}

func setField(fv reflect.Value, s string) error {
	if fv.Type() == durationType {
		d, err := time.ParseDuration(s)
		fv.SetInt(int64(d))
		return err
	}
	switch fv.Kind() {
	case reflect.String:
		fv.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		fv.SetBool(b)
		return err
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(s, 0, fv.Type().Bits())
		fv.SetInt(n)
		return err
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(s, 0, fv.Type().Bits())
		fv.SetUint(n)
		return err
	case reflect.Float32, reflect.Float64:
		x, err := strconv.ParseFloat(s, fv.Type().Bits())
		fv.SetFloat(x)
		return err
	default:
		return fmt.Errorf("unsupported kind %s", fv.Kind())
	}
	return nil
}
