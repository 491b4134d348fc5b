package snapshotstore_test

import (
	"context"
	"io"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/warmpool/warmpool/internal/testing/objectstore"
)

// A plain S3 client, as someone with access to the bucket (not the manager) has.
func rawClient(t *testing.T, srv *objectstore.Server) *minio.Client {
	c, err := minio.New(srv.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(objectstore.AccessKeyID, objectstore.SecretAccessKey, ""), Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func readRaw(ctx context.Context, t *testing.T, srv *objectstore.Server, key string) []byte {
	obj, err := rawClient(t, srv).GetObject(ctx, "snapshots", key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = obj.Close() }()
	b, err := io.ReadAll(obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func objectStoreCopy(ctx context.Context, t *testing.T, srv *objectstore.Server, from, to string) {
	if _, err := rawClient(t, srv).CopyObject(ctx, minio.CopyDestOptions{Bucket: "snapshots", Object: to},
		minio.CopySrcOptions{Bucket: "snapshots", Object: from}); err != nil {
		t.Fatal(err)
	}
}
