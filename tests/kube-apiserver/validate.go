package main

import (
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validate checks what kube-apiserver checks of every object's metadata, and of an
// events.k8s.io/v1 Event the rules of k8s.io/kubernetes' ValidateEventCreate and
// ValidateEventUpdate that a client can break (k8s.io/kubernetes is not packaged, so they are
// said again here): the reporting fields, action and reason are required and at most 128
// characters, the note at most 1 KiB, the type Normal or Warning, a series counts at least 2
// and has its last observed time, and an update changes nothing but the series (and metadata).
func validate(obj, old runtime.Object) field.ErrorList {
	var errs field.ErrorList
	m, err := meta.Accessor(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(field.NewPath("metadata"), err)}
	}
	path := field.NewPath("metadata")
	if old == nil {
		errs = append(errs, apivalidation.ValidateObjectMetaAccessor(m, true, apivalidation.NameIsDNSSubdomain, path)...)
	} else if o, err := meta.Accessor(old); err == nil {
		errs = append(errs, apivalidation.ValidateObjectMetaAccessorUpdate(m, o, path)...)
	}
	if e, ok := obj.(*eventsv1.Event); ok {
		errs = append(errs, validateEvent(e)...)
		if o, ok := old.(*eventsv1.Event); ok {
			errs = append(errs, validateEventUpdate(e, o)...)
		}
	}
	return errs
}

func validateEvent(e *eventsv1.Event) field.ErrorList {
	var errs field.ErrorList
	if e.EventTime.Time.IsZero() {
		errs = append(errs, field.Required(field.NewPath("eventTime"), ""))
	}
	required := map[string]string{
		"reportingController": e.ReportingController,
		"reportingInstance":   e.ReportingInstance,
		"action":              e.Action,
		"reason":              e.Reason,
	}
	for name, value := range required {
		if value == "" {
			errs = append(errs, field.Required(field.NewPath(name), ""))
		} else if len(value) > 128 {
			errs = append(errs, field.Invalid(field.NewPath(name), value, "can have at most 128 characters"))
		}
	}
	if e.Type != "Normal" && e.Type != "Warning" {
		errs = append(errs, field.NotSupported(field.NewPath("type"), e.Type, []string{"Normal", "Warning"}))
	}
	if len(e.Note) > 1024 {
		errs = append(errs, field.TooLong(field.NewPath("note"), "", 1024))
	}
	if e.Regarding.Kind == "" {
		errs = append(errs, field.Required(field.NewPath("regarding", "kind"), ""))
	}
	if s := e.Series; s != nil {
		if s.Count < 2 {
			errs = append(errs, field.Invalid(field.NewPath("series", "count"), s.Count, "should be at least 2"))
		}
		if s.LastObservedTime.Time.IsZero() {
			errs = append(errs, field.Required(field.NewPath("series", "lastObservedTime"), ""))
		}
	}
	return errs
}

func validateEventUpdate(e, old *eventsv1.Event) field.ErrorList {
	var errs field.ErrorList
	immutable := []struct {
		name     string
		new, old string
	}{
		{"reportingController", e.ReportingController, old.ReportingController},
		{"reportingInstance", e.ReportingInstance, old.ReportingInstance},
		{"action", e.Action, old.Action},
		{"reason", e.Reason, old.Reason},
		{"type", e.Type, old.Type},
		{"note", e.Note, old.Note},
		{"regarding", e.Regarding.String(), old.Regarding.String()},
	}
	for _, f := range immutable {
		if f.new != f.old {
			errs = append(errs, field.Invalid(field.NewPath(f.name), f.new, "field is immutable"))
		}
	}
	if !e.EventTime.Time.Equal(old.EventTime.Time) {
		errs = append(errs, field.Invalid(field.NewPath("eventTime"), e.EventTime, "field is immutable"))
	}
	return errs
}
