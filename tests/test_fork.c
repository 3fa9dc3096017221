/* A child forked after the runtime ran OpenMP threads can still use the
 * runtime: a layer made before the fork and one made in the child both run
 * their forwards (GCC's OpenMP cannot start the parent's threads again in the
 * child; a region on more than one thread there would wait for them forever)
 * and give the parent's bits. Each child has an alarm: a hang fails the test
 * rather than stopping it. ctest: two cores (the layers ask for two threads). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sneppx/sneppx.h"
#include "test_util.h"

enum { HIDDEN = 64, BATCH = 2, SEQ = 40, TOKENS = BATCH * SEQ, CHILD_SECONDS = 20 };

static float hidden[TOKENS * HIDDEN], want[TOKENS * HIDDEN], got[TOKENS * HIDDEN];

static void config_with_threads(sneppx_config *c, int num_threads)
{
    sneppx_config_init(c);
    c->hidden_size = HIDDEN, c->num_attention_heads = 4, c->num_key_value_heads = 2, c->head_dim = 16;
    c->num_threads = num_threads;
}

/* In the child: 0 when both layers give want, else which step failed. */
static int child(sneppx_layer *inherited, const sneppx_config *config)
{
    alarm(CHILD_SECONDS);
    memset(got, 0, sizeof got);
    if (sneppx_layer_forward(inherited, BATCH, SEQ, hidden, NULL, NULL, NULL, got) != SNEPPX_OK)
        return 2;
    if (memcmp(got, want, sizeof got) != 0)
        return 3;
    sneppx_layer *fresh = NULL;
    if (sneppx_layer_create(config, NULL, &fresh) != SNEPPX_OK)
        return 4;
    memset(got, 0, sizeof got);
    const int ok = sneppx_layer_forward(fresh, BATCH, SEQ, hidden, NULL, NULL, NULL, got) == SNEPPX_OK &&
                   memcmp(got, want, sizeof got) == 0;
    sneppx_layer_destroy(fresh);
    return ok ? 0 : 5;
}

static void fork_after_forward(test_tally *tally, int num_threads)
{
    sneppx_config config;
    config_with_threads(&config, num_threads);
    sneppx_layer *layer = NULL;
    if (!TEST_CHECK(tally, sneppx_layer_create(&config, NULL, &layer) == SNEPPX_OK, "create: %s",
                    sneppx_last_error()))
        return;
    TEST_CHECK(tally, sneppx_layer_forward(layer, BATCH, SEQ, hidden, NULL, NULL, NULL, want) == SNEPPX_OK,
               "forward: %s", sneppx_last_error());
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0)
        _exit(child(layer, &config));
    int status = 0;
    TEST_CHECK(tally, pid > 0 && waitpid(pid, &status, 0) == pid, "fork / waitpid");
    TEST_CHECK(tally, WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "num_threads %d: the forked child %s %d (2: forward failed, 3: differs, 4: create failed, "
               "5: the new layer's forward failed or differs; SIGALRM %d: it hung)",
               num_threads, WIFEXITED(status) ? "exited with" : "was killed by signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), SIGALRM);
    /* The parent keeps its threads. */
    TEST_CHECK(tally, sneppx_layer_forward(layer, BATCH, SEQ, hidden, NULL, NULL, NULL, got) == SNEPPX_OK &&
                      memcmp(got, want, sizeof got) == 0,
               "the parent's forward after the fork");
    sneppx_layer_destroy(layer);
}

int main(void)
{
    test_tally tally = {0};
    test_rng rng = test_rng_seeded(21);
    test_fill_uniform(&rng, hidden, TOKENS * HIDDEN, 1.0f);
    fork_after_forward(&tally, 2);
    fork_after_forward(&tally, 0);
    return test_finish(&tally);
}
