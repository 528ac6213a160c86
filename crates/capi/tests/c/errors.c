/*
 * The C API's error paths, through the real C ABI and the generated header: invalid options and
 * NULL pointers come back as ZMEM_INVALID_ARGUMENT with a message, never a crash. Needs no
 * userfaultfd (no region is ever created). Prints one line per check; exits 0 when all pass.
 */
#include <stdio.h>
#include <string.h>

#include "zmem.h"

static int failures = 0;

/* `status` must be ZMEM_INVALID_ARGUMENT and zmem_last_error() must mention `needle`. */
static void expect_invalid(const char *what, zmem_status status, const char *needle) {
    const char *msg = zmem_last_error();
    if (status != ZMEM_INVALID_ARGUMENT) {
        printf("FAIL %s: status %s (%d), expected ZMEM_INVALID_ARGUMENT\n", what,
               zmem_status_str(status), (int)status);
        failures++;
    } else if (msg == NULL || strstr(msg, needle) == NULL) {
        printf("FAIL %s: message \"%s\" does not mention \"%s\"\n", what, msg ? msg : "(null)",
               needle);
        failures++;
    } else {
        printf("ok %s: %s\n", what, msg);
    }
}

static zmem_options base_options(void) {
    zmem_options o;
    if (zmem_options_init(&o) != ZMEM_OK) {
        printf("FAIL zmem_options_init\n");
        failures++;
    }
    o.size = 64u << 20;
    o.resident = 8u << 20;
    return o;
}

/* Creating a region with `o` must fail with ZMEM_INVALID_ARGUMENT and leave *out NULL. */
static void expect_create_invalid(const char *what, zmem_options o, const char *needle) {
    zmem_region *region = (zmem_region *)&o; /* not NULL: create must clear it */
    zmem_status status = zmem_region_create(&o, &region);
    if (region != NULL) {
        printf("FAIL %s: *out not cleared on failure\n", what);
        failures++;
    }
    expect_invalid(what, status, needle);
}

int main(void) {
    /* Nothing failed yet on this thread: an empty message, never NULL. */
    if (zmem_last_error() == NULL || zmem_last_error()[0] != '\0') {
        printf("FAIL zmem_last_error before any error\n");
        failures++;
    }
    if (zmem_version() == NULL || zmem_version()[0] == '\0') {
        printf("FAIL zmem_version\n");
        failures++;
    }

    zmem_options o = base_options();
    if (o.policy != ZMEM_POLICY_FAST || o.eviction != ZMEM_EVICTION_CLOCK || o.adaptive ||
        o.fault_around != 16 || o.handler_threads != 1) {
        printf("FAIL defaults\n");
        failures++;
    }

    o = base_options();
    o.size = 0;
    expect_create_invalid("size 0", o, "size is 0");

    o = base_options();
    o.resident = o.size + 1;
    expect_create_invalid("resident > size", o, "larger than the region");

    o = base_options();
    o.resident = 0;
    expect_create_invalid("resident 0", o, "resident is 0");

    o = base_options();
    o.adaptive = true;
    o.adaptive_min = 16u << 20;
    o.adaptive_max = 8u << 20;
    expect_create_invalid("adaptive min > max", o, "adaptive_min");

    o = base_options();
    o.policy = 99;
    expect_create_invalid("unknown policy", o, "policy 99");

    o = base_options();
    o.eviction = -1;
    expect_create_invalid("unknown eviction", o, "eviction -1");

    o = base_options();
    o.handler_threads = 0;
    expect_create_invalid("no handler threads", o, "handler_threads");

    /* NULL pointers. */
    expect_invalid("options_init(NULL)", zmem_options_init(NULL), "options is NULL");
    zmem_region *region = NULL;
    expect_invalid("create(NULL, &region)", zmem_region_create(NULL, &region), "options is NULL");
    o = base_options();
    expect_invalid("create(&o, NULL)", zmem_region_create(&o, NULL), "out is NULL");
    zmem_stats st;
    expect_invalid("stats(NULL, &st)", zmem_region_stats(NULL, &st), "region is NULL");
    expect_invalid("set_resident(NULL)", zmem_region_set_resident(NULL, 1u << 20),
                   "region is NULL");
    if (zmem_region_base(NULL) != NULL || zmem_region_size(NULL) != 0) {
        printf("FAIL base/size of NULL\n");
        failures++;
    } else {
        printf("ok base/size of NULL: NULL, 0\n");
    }
    zmem_region_destroy(NULL);
    printf("ok destroy(NULL)\n");

    if (strcmp(zmem_status_str(ZMEM_PERMISSION), "ZMEM_PERMISSION") != 0 ||
        strcmp(zmem_status_str(12345), "ZMEM_UNKNOWN") != 0) {
        printf("FAIL zmem_status_str\n");
        failures++;
    }

    if (failures) {
        printf("%d FAILED\n", failures);
        return 1;
    }
    printf("ALL OK\n");
    return 0;
}
