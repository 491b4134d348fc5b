package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ModelEndpointSpec is an OpenAI-compatible chat-completions endpoint that
// answers the llm_query calls of Executions whose pool names it. The manager
// makes the calls (the sandboxes have no egress) with a key only the manager
// reads. Cluster-scoped, for a platform team to own: a tenant who may edit
// pools picks an endpoint by name but cannot point the key at a URL of its own.
type ModelEndpointSpec struct {
	// url of the chat-completions API, e.g. https://api.openai.com/v1/chat/completions.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (url(self).getScheme() == 'https' || url(self).getScheme() == 'http')",message="url must be an http or https URL, e.g. https://api.openai.com/v1/chat/completions"
	// +required
	URL string `json:"url"`

	// model is the model name sent with each call.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +required
	Model string `json:"model"`

	// apiKeySecretRef names the key of a Secret in the manager's namespace
	// (warmpool-system) holding the API key, sent as a bearer token. Unset:
	// calls carry no key (a local model server).
	// +optional
	APIKeySecretRef *SecretKeyReference `json:"apiKeySecretRef,omitempty"`

	// namespaceSelector picks the namespaces whose pools may use this
	// endpoint; unset or empty: every namespace.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// limits bound what one run of code may ask of the endpoint.
	// +kubebuilder:default={}
	// +optional
	Limits ModelLimits `json:"limits,omitempty"`
}

// SecretKeyReference names one key of a Secret.
type SecretKeyReference struct {
	// name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// key in the Secret's data.
	// +kubebuilder:default=apiKey
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Key string `json:"key,omitempty"`
}

// ModelLimits bound the model calls of one run.
type ModelLimits struct {
	// maxCallsPerRun is how many llm_query/rlm_query calls one run may make;
	// the next raises RuntimeError in the code.
	// +kubebuilder:default=20
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MaxCallsPerRun int32 `json:"maxCallsPerRun,omitempty"`

	// maxPromptBytes bounds one call's prompt.
	// +kubebuilder:default=65536
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16777216
	// +optional
	MaxPromptBytes int32 `json:"maxPromptBytes,omitempty"`

	// maxTokens is sent as max_tokens: the most one completion may use.
	// +kubebuilder:default=1024
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	MaxTokens int32 `json:"maxTokens,omitempty"`

	// callTimeout bounds one call; the run's own timeout bounds them all.
	// +kubebuilder:default="60s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('10m')",message="callTimeout must be between 1s and 10m"
	// +optional
	CallTimeout *metav1.Duration `json:"callTimeout,omitempty"`
}

// ModelEndpointStatus says whether the endpoint can be used.
type ModelEndpointStatus struct {
	// conditions: Ready is True when the API key's Secret was found.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=mep,categories=warmpool
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.model`
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.spec.url`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// ModelEndpoint is a language model that Executions' code may ask through
// llm_query, via the manager.
type ModelEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ModelEndpointSpec `json:"spec"`
	// +optional
	Status ModelEndpointStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ModelEndpointList is a list of ModelEndpoints.
type ModelEndpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelEndpoint `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ModelEndpoint{}, &ModelEndpointList{})
}
