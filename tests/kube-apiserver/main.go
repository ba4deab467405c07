// steward-test-apiserver: the project's test API server, built from Kubernetes' own API
// server libraries (k8s.io/apiserver and k8s.io/apiextensions-apiserver, as Debian packages
// them: see scripts/build-test-apiserver.sh).
//
// It serves, from etcd, with Kubernetes' watch cache (the cacher) in front of its etcd3
// storage, exactly as kube-apiserver does:
//   - core/v1 Pods, apps/v1 StatefulSets, events.k8s.io/v1 Events and
//     coordination.k8s.io/v1 Leases (k8s.io/api's types, stored under /registry/...);
//   - CustomResourceDefinitions and their custom resources (the apiextensions server,
//     delegated to as kube-apiserver delegates to it).
//
// What kube-apiserver has and this has not (they live in k8s.io/kubernetes, which is not
// packaged): type defaulting and most type validation (names, namespaces and the
// Event fields the agent sends are validated here), /scale, graceful deletion, RBAC, admission
// and controllers.
//
// Authentication is by bearer token from --token-auth-file (the kube-apiserver CSV:
// token,user,uid,"group1,group2"). Authorization: a user in system:masters may do
// anything; a user in steward:read-only may get, list and watch; anyone else is refused
// with 403, as RBAC would refuse a ServiceAccount without a role.
package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"time"

	"github.com/spf13/pflag"

	noopoteltrace "go.opentelemetry.io/otel/trace/noop"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	extensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	extensionsoptions "k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/token/tokenfile"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/apiserver/pkg/util/openapi"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/component-base/cli"

	"github.com/spf13/cobra"
	"k8s.io/kube-openapi/pkg/common"
	openapiutil "k8s.io/kube-openapi/pkg/util"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// The scheme of the built-in types served here. k8s.io/api has external types only, so
// each is also registered as its group's internal version (the API machinery's hub),
// with an identity conversion between the two.
var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

type kind struct {
	gv      schema.GroupVersion
	object  runtime.Object
	list    runtime.Object
	plural  string
	newFunc func() runtime.Object
	newList func() runtime.Object
}

var kinds = []kind{
	{corev1.SchemeGroupVersion, &corev1.Pod{}, &corev1.PodList{}, "pods",
		func() runtime.Object { return &corev1.Pod{} }, func() runtime.Object { return &corev1.PodList{} }},
	{appsv1.SchemeGroupVersion, &appsv1.StatefulSet{}, &appsv1.StatefulSetList{}, "statefulsets",
		func() runtime.Object { return &appsv1.StatefulSet{} }, func() runtime.Object { return &appsv1.StatefulSetList{} }},
	{eventsv1.SchemeGroupVersion, &eventsv1.Event{}, &eventsv1.EventList{}, "events",
		func() runtime.Object { return &eventsv1.Event{} }, func() runtime.Object { return &eventsv1.EventList{} }},
	{coordinationv1.SchemeGroupVersion, &coordinationv1.Lease{}, &coordinationv1.LeaseList{}, "leases",
		func() runtime.Object { return &coordinationv1.Lease{} }, func() runtime.Object { return &coordinationv1.LeaseList{} }},
}

func init() {
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(appsv1.AddToScheme(scheme))
	utilruntime.Must(eventsv1.AddToScheme(scheme))
	utilruntime.Must(coordinationv1.AddToScheme(scheme))
	for _, k := range kinds {
		internal := schema.GroupVersion{Group: k.gv.Group, Version: runtime.APIVersionInternal}
		scheme.AddKnownTypes(internal, k.object, k.list)
		for _, t := range []runtime.Object{k.object, k.list} {
			utilruntime.Must(scheme.AddConversionFunc(t, t, identity))
		}
	}
	// The options every group's requests carry (list, get, delete...), in the internal versions.
	for _, k := range kinds {
		internal := schema.GroupVersion{Group: k.gv.Group, Version: runtime.APIVersionInternal}
		scheme.AddKnownTypes(internal, &metav1.ListOptions{}, &metav1.GetOptions{},
			&metav1.DeleteOptions{}, &metav1.CreateOptions{}, &metav1.UpdateOptions{}, &metav1.PatchOptions{})
	}
}

func identity(a, b interface{}, _ conversion.Scope) error {
	reflect.ValueOf(b).Elem().Set(reflect.ValueOf(a).Elem())
	return nil
}

// strategy: names are generated and checked, metadata validated; an Event is checked as
// kube-apiserver checks an events.k8s.io/v1 Event.
type strategy struct {
	runtime.ObjectTyper
	names.NameGenerator
}

func (strategy) NamespaceScoped() bool                                            { return true }
func (strategy) PrepareForCreate(context.Context, runtime.Object)                 {}
func (strategy) PrepareForUpdate(context.Context, runtime.Object, runtime.Object) {}
func (strategy) WarningsOnCreate(context.Context, runtime.Object) []string        { return nil }
func (strategy) WarningsOnUpdate(context.Context, runtime.Object, runtime.Object) []string {
	return nil
}
func (strategy) Canonicalize(runtime.Object)    {}
func (strategy) AllowCreateOnUpdate() bool      { return false }
func (strategy) AllowUnconditionalUpdate() bool { return true }
func (s strategy) Validate(_ context.Context, obj runtime.Object) field.ErrorList {
	return validate(obj, nil)
}
func (s strategy) ValidateUpdate(_ context.Context, obj, old runtime.Object) field.ErrorList {
	return validate(obj, old)
}

// eventTTL: how long an Event lives, as kube-apiserver's --event-ttl (each Event is written
// to etcd with a lease of this TTL).
var eventTTL = time.Hour

func restStore(k kind, getter generic.RESTOptionsGetter) (*genericregistry.Store, error) {
	s := strategy{scheme, names.SimpleNameGenerator}
	resource := k.gv.WithResource(k.plural).GroupResource()
	store := &genericregistry.Store{
		NewFunc:                   k.newFunc,
		NewListFunc:               k.newList,
		DefaultQualifiedResource:  resource,
		SingularQualifiedResource: k.gv.WithResource(singular(k.plural)).GroupResource(),
		CreateStrategy:            s,
		UpdateStrategy:            s,
		DeleteStrategy:            s,
		TableConvertor:            rest.NewDefaultTableConvertor(resource),
	}
	if k.plural == "events" {
		store.TTLFunc = func(runtime.Object, uint64, bool) (uint64, error) {
			return uint64(eventTTL.Seconds()), nil
		}
	}
	if err := store.CompleteWithOptions(&generic.StoreOptions{RESTOptions: getter}); err != nil {
		return nil, err
	}
	return store, nil
}

// coreDefinitions: each served type as an object that keeps every field, as a CRD without a
// schema is, so that managed fields and server-side apply work untyped.
func coreDefinitions(common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	defs := map[string]common.OpenAPIDefinition{}
	for _, k := range kinds {
		for _, o := range []runtime.Object{k.object, k.list} {
			defs[openapiutil.GetCanonicalTypeName(o)] = common.OpenAPIDefinition{Schema: spec.Schema{
				SchemaProps:      spec.SchemaProps{Type: []string{"object"}},
				VendorExtensible: spec.VendorExtensible{Extensions: spec.Extensions{"x-kubernetes-preserve-unknown-fields": true}},
			}}
		}
	}
	return defs
}

func singular(plural string) string { return plural[:len(plural)-1] }

// authorize: system:masters does anything, steward:read-only reads, anyone else is refused.
type authorize struct{}

func (authorize) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if a.GetUser() == nil {
		return authorizer.DecisionDeny, "no user", nil
	}
	for _, g := range a.GetUser().GetGroups() {
		if g == "system:masters" {
			return authorizer.DecisionAllow, "", nil
		}
		if g == "steward:read-only" && (a.GetVerb() == "get" || a.GetVerb() == "list" || a.GetVerb() == "watch") {
			return authorizer.DecisionAllow, "", nil
		}
	}
	return authorizer.DecisionNoOpinion, fmt.Sprintf("%s may not %s %s", a.GetUser().GetName(), a.GetVerb(), a.GetResource()), nil
}

type noServices struct{}

func (noServices) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	return nil, fmt.Errorf("this test API server serves no Services (%s/%s)", namespace, name)
}

func main() {
	o := extensionsoptions.NewCustomResourceDefinitionsServerOptions(os.Stdout, os.Stderr)
	// Kubernetes' own layout in etcd: /registry/<resource>/<namespace>/<name>.
	o.RecommendedOptions.Etcd.StorageConfig.Prefix = "/registry"
	// Authentication and authorization are this server's own (see above); there is no
	// kube-apiserver to delegate them, nor the core APIs admission and fairness need.
	o.RecommendedOptions.Authentication = nil
	o.RecommendedOptions.Authorization = nil
	o.RecommendedOptions.CoreAPI = nil
	o.RecommendedOptions.Admission = nil
	o.RecommendedOptions.Features.EnablePriorityAndFairness = false
	var tokenFile string

	cmd := &cobra.Command{
		Use:          "steward-test-apiserver",
		Short:        "Kubernetes' API server libraries serving Pods, StatefulSets, Events, Leases and CRDs from etcd",
		SilenceUsage: true,
		RunE: func(c *cobra.Command, _ []string) error {
			if tokenFile == "" {
				return fmt.Errorf("--token-auth-file is required")
			}
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return run(c.Context(), o, tokenFile)
		},
	}
	fs := cmd.Flags()
	o.AddFlags(fs)
	fs.DurationVar(&eventTTL, "event-ttl", time.Hour, "how long an Event is kept (each is written with an etcd lease of this TTL), as kube-apiserver's")
	fs.StringVar(&tokenFile, "token-auth-file", "", "the bearer tokens: token,user,uid,\"group1,group2\" per line")
	_ = pflag.CommandLine
	cmd.SetContext(genericapiserver.SetupSignalContext())
	os.Exit(cli.Run(cmd))
}

func run(ctx context.Context, o *extensionsoptions.CustomResourceDefinitionsServerOptions, tokenFile string) error {
	if err := o.RecommendedOptions.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
		return fmt.Errorf("self-signed serving certificate: %w", err)
	}
	serverConfig := genericapiserver.NewRecommendedConfig(extensionsapiserver.Codecs)
	if err := o.ServerRunOptions.ApplyTo(&serverConfig.Config); err != nil {
		return err
	}
	if err := o.RecommendedOptions.ApplyTo(serverConfig); err != nil {
		return err
	}
	if err := o.APIEnablement.ApplyTo(&serverConfig.Config, extensionsapiserver.DefaultAPIResourceConfigSource(), extensionsapiserver.Scheme); err != nil {
		return err
	}
	tokens, err := tokenfile.NewCSV(tokenFile)
	if err != nil {
		return fmt.Errorf("--token-auth-file %s: %w", tokenFile, err)
	}
	serverConfig.Authentication.Authenticator = bearertoken.New(tokens)
	serverConfig.Authorization.Authorizer = authorize{}
	genericapiserver.AuthorizeClientBearerToken(serverConfig.LoopbackClientConfig, &serverConfig.Authentication, &serverConfig.Authorization)
	loopback, err := kubernetes.NewForConfig(serverConfig.LoopbackClientConfig)
	if err != nil {
		return err
	}
	serverConfig.SharedInformerFactory = informers.NewSharedInformerFactory(loopback, 10*time.Minute)

	// The core server: a copy of the generic configuration. k8s.io/api's OpenAPI
	// definitions are generated in k8s.io/kubernetes, which is not packaged: each type is
	// described as an object of any fields (see coreDefinitions), and no /openapi is served.
	coreConfig := genericapiserver.RecommendedConfig{Config: serverConfig.Config, SharedInformerFactory: serverConfig.SharedInformerFactory}
	coreConfig.Serializer = codecs
	coreConfig.OpenAPIConfig = nil
	coreConfig.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(coreDefinitions, openapinamer.NewDefinitionNamer(scheme))
	coreConfig.SkipOpenAPIInstallation = true

	serverConfig.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(openapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(generatedopenapi.GetOpenAPIDefinitions), openapinamer.NewDefinitionNamer(extensionsapiserver.Scheme, clientscheme.Scheme))
	crdConfig := &extensionsapiserver.Config{
		GenericConfig: serverConfig,
		ExtraConfig: extensionsapiserver.ExtraConfig{
			CRDRESTOptionsGetter: extensionsoptions.NewCRDRESTOptionsGetter(*o.RecommendedOptions.Etcd, serverConfig.ResourceTransformers, serverConfig.StorageObjectCountTracker),
			ServiceResolver:      noServices{},
			AuthResolverWrapper:  webhook.NewDefaultAuthenticationInfoResolverWrapper(nil, nil, serverConfig.LoopbackClientConfig, noopoteltrace.NewTracerProvider()),
		},
	}
	crdServer, err := crdConfig.Complete().New(genericapiserver.NewEmptyDelegate())
	if err != nil {
		return fmt.Errorf("the CustomResourceDefinition server: %w", err)
	}

	core, err := coreConfig.Complete().New("steward-test-core", crdServer.GenericAPIServer)
	if err != nil {
		return fmt.Errorf("the core server: %w", err)
	}
	etcd := *o.RecommendedOptions.Etcd
	var gvs schema.GroupVersions
	for _, k := range kinds {
		gvs = append(gvs, k.gv)
	}
	json := codecs.LegacyCodec(gvs...)
	etcd.StorageConfig.Codec = json
	getter := etcd.CreateRESTOptionsGetter(&genericoptions.SimpleStorageFactory{StorageConfig: etcd.StorageConfig}, serverConfig.ResourceTransformers)

	groups := map[string]*genericapiserver.APIGroupInfo{}
	var order []string
	for _, k := range kinds {
		info, ok := groups[k.gv.Group]
		if !ok {
			i := genericapiserver.NewDefaultAPIGroupInfo(k.gv.Group, scheme, metav1.ParameterCodec, codecs)
			info = &i
			groups[k.gv.Group] = info
			order = append(order, k.gv.Group)
		}
		store, err := restStore(k, getter)
		if err != nil {
			return fmt.Errorf("%s: %w", k.plural, err)
		}
		if info.VersionedResourcesStorageMap[k.gv.Version] == nil {
			info.VersionedResourcesStorageMap[k.gv.Version] = map[string]rest.Storage{}
		}
		info.VersionedResourcesStorageMap[k.gv.Version][k.plural] = store
	}
	for _, g := range order {
		if g == "" {
			if err := core.InstallLegacyAPIGroup(genericapiserver.DefaultLegacyAPIPrefix, groups[g]); err != nil {
				return fmt.Errorf("installing core/v1: %w", err)
			}
			continue
		}
		if err := core.InstallAPIGroup(groups[g]); err != nil {
			return fmt.Errorf("installing %s: %w", g, err)
		}
	}
	return core.PrepareRun().RunWithContext(ctx)
}
