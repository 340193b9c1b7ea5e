package tenancy

import (
	"context"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/flotilla-io/flotilla/internal/kubeclient"
	"github.com/flotilla-io/flotilla/offload"
	"github.com/flotilla-io/flotilla/offload/grant"
)

// Token is a credential issued to a consumer and when it expires. The
// credential never prints itself (grant.Token).
type Token struct {
	Value   grant.Token
	Expires time.Time
}

// Issue makes a new token for consumer's ServiceAccount with the audience
// and lifetime of t, bound to its grant Secret, and checks that the API
// server authenticates it as the consumer. Earlier tokens keep working
// until they expire or the grant is removed.
func (t *Tenants) Issue(ctx context.Context, consumer string) (Token, error) {
	return t.issueCounted(ctx, consumer, true)
}

// issueCounted issues, counts and logs a token; readNamespace checks
// that the tenant namespace is ours (EnsureIssued has just made or
// checked it).
func (t *Tenants) issueCounted(ctx context.Context, consumer string, readNamespace bool) (Token, error) {
	tok, err := t.issue(ctx, consumer, readNamespace)
	if err != nil {
		t.metrics.fail.Inc()
		return Token{}, fmt.Errorf("issue token for %s: %w", consumer, err)
	}
	t.metrics.issued.Inc()
	t.log.Info("token issued", "consumer", consumer, "audience", t.audience, "expires", tok.Expires)
	return tok, nil
}

func (t *Tenants) issue(ctx context.Context, consumer string, readNamespace bool) (Token, error) {
	name := offload.TenantNamespace(consumer)
	seconds := int64(t.lifetime / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:         []string{t.audience},
		ExpirationSeconds: &seconds,
		// By name only: the API server looks the Secret up and binds the
		// token to its UID; the agent may not read Secrets.
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: offload.GrantSecret},
	}}
	// The namespace is read while the token is made: a namespace of that
	// name that is not ours may hold an account with other rights, and
	// its token is then dropped, never handed out.
	var ours error
	var wg sync.WaitGroup
	if readNamespace {
		wg.Go(func() { ours = t.readOurs(ctx, name, consumer) })
	}
	resp, err := t.Client.CoreV1().ServiceAccounts(name).CreateToken(ctx, offload.ConsumerServiceAccount, req, metav1.CreateOptions{})
	wg.Wait()
	if ours != nil {
		return Token{}, ours
	}
	if err != nil {
		return Token{}, fmt.Errorf("TokenRequest for %s/%s: %w", name, offload.ConsumerServiceAccount, err)
	}
	tok := Token{Value: grant.NewToken(resp.Status.Token), Expires: resp.Status.ExpirationTimestamp.Time}
	if err := t.check(ctx, tok, offload.ConsumerUser(consumer)); err != nil {
		return Token{}, err
	}
	return tok, nil
}

// readOurs reads namespace name: nil when it is consumer's tenant, else
// why not.
func (t *Tenants) readOurs(ctx context.Context, name, consumer string) error {
	ns, err := t.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("no tenant namespace %s: ensure the tenant first", name)
	case err != nil:
		return fmt.Errorf("read namespace %s: %w", name, err)
	}
	return CheckOurs(ns, consumer)
}

// check makes a SelfSubjectReview with tok against the API server the
// tokens are for and wants it to answer user.
func (t *Tenants) check(ctx context.Context, tok Token, user string) error {
	cfg := rest.AnonymousClientConfig(t.config)
	cfg.BearerToken = tok.Value.Reveal()
	c, err := kubeclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("check the token: client for %s: %w", cfg.Host, err)
	}
	review, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if apierrors.IsUnauthorized(err) {
		return fmt.Errorf("the API server does not accept tokens for audience %s: add it to kube-apiserver --api-audiences (after the issuer's), or run the agent with --grant-audience=AUDIENCE, one it accepts", t.audience)
	}
	if err != nil {
		return fmt.Errorf("check the token with a SelfSubjectReview at %s: %w", cfg.Host, err)
	}
	if got := review.Status.UserInfo.Username; got != user {
		return fmt.Errorf("check the token: the API server at %s authenticates it as %q, want %q", cfg.Host, got, user)
	}
	return nil
}
