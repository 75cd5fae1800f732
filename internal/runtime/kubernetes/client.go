package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// client is the little of the Kubernetes API the runtime uses (pods and their exec, nodes,
// ConfigMaps, namespaces, NetworkPolicies, RuntimeClasses, the server's version) over
// client-go's REST client, with a scheme of only those groups. Not client-go's generated
// clientset: it registers every API group of Kubernetes at init, in every process of the
// binary — each sandbox's agent included (about 1.3 MB of heap each) — and brings 20 MB of
// code the runtime never calls.
type client struct {
	core, networking, node rest.Interface
	params                 kruntime.ParameterCodec
}

// newClient makes the runtime's client on the shared HTTP client hc.
func newClient(rc *rest.Config, hc *http.Client) (*client, error) {
	s := kruntime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(networkingv1.AddToScheme(s))
	utilruntime.Must(nodev1.AddToScheme(s))
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	codecs := serializer.NewCodecFactory(s).WithoutConversion()
	group := func(gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
		c := rest.CopyConfig(rc)
		c.GroupVersion, c.APIPath, c.NegotiatedSerializer = &gv, apiPath, codecs
		return rest.RESTClientForConfigAndClient(c, hc)
	}
	var c client
	var err error
	if c.core, err = group(corev1.SchemeGroupVersion, "/api"); err != nil {
		return nil, err
	}
	if c.networking, err = group(networkingv1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	if c.node, err = group(nodev1.SchemeGroupVersion, "/apis"); err != nil {
		return nil, err
	}
	c.params = kruntime.NewParameterCodec(s)
	return &c, nil
}

func (c *client) pods(ns string) kind[*corev1.Pod, *corev1.PodList] {
	return kind[*corev1.Pod, *corev1.PodList]{c.core, c.params, ns, "pods", func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} }}
}

func (c *client) nodes() kind[*corev1.Node, *corev1.NodeList] {
	return kind[*corev1.Node, *corev1.NodeList]{c.core, c.params, "", "nodes", func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} }}
}

func (c *client) configMaps(ns string) kind[*corev1.ConfigMap, *corev1.ConfigMapList] {
	return kind[*corev1.ConfigMap, *corev1.ConfigMapList]{c.core, c.params, ns, "configmaps", func() *corev1.ConfigMap { return &corev1.ConfigMap{} }, func() *corev1.ConfigMapList { return &corev1.ConfigMapList{} }}
}

func (c *client) namespaces() kind[*corev1.Namespace, *corev1.NamespaceList] {
	return kind[*corev1.Namespace, *corev1.NamespaceList]{c.core, c.params, "", "namespaces", func() *corev1.Namespace { return &corev1.Namespace{} }, func() *corev1.NamespaceList { return &corev1.NamespaceList{} }}
}

func (c *client) networkPolicies(ns string) kind[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList] {
	return kind[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList]{c.networking, c.params, ns, "networkpolicies",
		func() *networkingv1.NetworkPolicy { return &networkingv1.NetworkPolicy{} }, func() *networkingv1.NetworkPolicyList { return &networkingv1.NetworkPolicyList{} }}
}

func (c *client) runtimeClasses() kind[*nodev1.RuntimeClass, *nodev1.RuntimeClassList] {
	return kind[*nodev1.RuntimeClass, *nodev1.RuntimeClassList]{c.node, c.params, "", "runtimeclasses",
		func() *nodev1.RuntimeClass { return &nodev1.RuntimeClass{} }, func() *nodev1.RuntimeClassList { return &nodev1.RuntimeClassList{} }}
}

// serverVersion is the API server's GET /version.
func (c *client) serverVersion(ctx context.Context) (version.Info, error) {
	var v version.Info
	raw, err := c.core.Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("GET /version: %w", err)
	}
	return v, nil
}

// execRequest is pods/exec of pod id in ns (the request whose URL an executor dials).
func (c *client) execRequest(ns, id string, opts *corev1.PodExecOptions) *rest.Request {
	return c.core.Post().Resource("pods").Namespace(ns).Name(id).SubResource("exec").VersionedParams(opts, c.params)
}

// kind is one kind of object, in namespace ns ("" for a cluster-scoped kind), with the
// calls of client-go's typed clients that the runtime makes.
type kind[T, L kruntime.Object] struct {
	c      rest.Interface
	params kruntime.ParameterCodec
	ns     string
	name   string
	newT   func() T
	newL   func() L
}

func (r kind[T, L]) req(verb func() *rest.Request) *rest.Request {
	return verb().NamespaceIfScoped(r.ns, r.ns != "").Resource(r.name)
}

func (r kind[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	out := r.newT()
	err := r.req(r.c.Get).Name(name).VersionedParams(&opts, r.params).Do(ctx).Into(out)
	return out, err
}

func (r kind[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	out := r.newL()
	req := r.req(r.c.Get).VersionedParams(&opts, r.params)
	if opts.TimeoutSeconds != nil {
		req = req.Timeout(time.Duration(*opts.TimeoutSeconds) * time.Second)
	}
	err := req.Do(ctx).Into(out)
	return out, err
}

func (r kind[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	req := r.req(r.c.Get).VersionedParams(&opts, r.params)
	if opts.TimeoutSeconds != nil {
		req = req.Timeout(time.Duration(*opts.TimeoutSeconds) * time.Second)
	}
	return req.Watch(ctx)
}

func (r kind[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	out := r.newT()
	err := r.req(r.c.Post).VersionedParams(&opts, r.params).Body(obj).Do(ctx).Into(out)
	return out, err
}

func (r kind[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return r.req(r.c.Delete).Name(name).Body(&opts).Do(ctx).Error()
}

func (r kind[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (T, error) {
	out := r.newT()
	err := r.req(func() *rest.Request { return r.c.Patch(pt) }).Name(name).VersionedParams(&opts, r.params).Body(data).Do(ctx).Into(out)
	return out, err
}
