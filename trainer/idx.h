/* Fashion-MNIST on disk: IDX files (big-endian header, then raw bytes), gzip-compressed or
 * plain, read with zlib. Every failure comes back as a sentence naming the file. */
#ifndef TRAIN_IDX_H_
#define TRAIN_IDX_H_

#include <stddef.h>
#include <stdint.h>

#define IDX_NUM_CLASSES 10

typedef struct {
  int count, rows, cols;
  uint8_t* images; /* count x rows x cols pixels, row-major */
  uint8_t* labels; /* count labels in [0, IDX_NUM_CLASSES) */
} idx_set_t;

/* Loads DIR/<prefix>-images-idx3-ubyte[.gz] and DIR/<prefix>-labels-idx1-ubyte[.gz]
 * (prefix "train" or "t10k"). Returns 0, or -1 with a message in err. */
int idx_load_set(const char* dir, const char* prefix, idx_set_t* set, char* err, size_t errlen);

/* The two halves, for tests and for other file names. */
int idx_load_images(const char* path, idx_set_t* set, char* err, size_t errlen);
int idx_load_labels(const char* path, idx_set_t* set, char* err, size_t errlen);

void idx_free(idx_set_t* set);

#endif /* TRAIN_IDX_H_ */
