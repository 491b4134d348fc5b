package snapshotstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultKeySecret, in the manager's namespace, holds the key snapshots are
// sealed with (data "key", 32 bytes) when no key file is given.
const DefaultKeySecret = "warmpool-snapshot-key"

// LoadKey reads the snapshot key from file, when given, else from the
// Secret, creating the Secret with a new random key when there is none. Two
// replicas that both find none both create one: the second create fails
// and both read the one stored.
func LoadKey(ctx context.Context, c client.Client, reader client.Reader, file string, secret types.NamespacedName) ([]byte, error) {
	if file != "" {
		key, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("read the snapshot key: %w", err)
		}
		if len(key) != 32 {
			return nil, fmt.Errorf("the snapshot key in %s is %d bytes; it must be 32 (head -c32 /dev/urandom)", file, len(key))
		}
		return key, nil
	}
	for range 2 {
		s := &corev1.Secret{}
		err := reader.Get(ctx, secret, s)
		if err == nil {
			if len(s.Data["key"]) != 32 {
				return nil, fmt.Errorf("Secret %s holds no 32-byte key", secret)
			}
			return s.Data["key"], nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("read the snapshot key Secret %s: %w", secret, err)
		}
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secret.Namespace, Name: secret.Name,
			Labels: map[string]string{"app.kubernetes.io/name": "warmpool"}}, Data: map[string][]byte{"key": key}}
		if err := c.Create(ctx, s); err == nil {
			return key, nil
		} else if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create the snapshot key Secret %s: %w", secret, err)
		}
	}
	return nil, fmt.Errorf("the snapshot key Secret %s was created and is gone", secret)
}
