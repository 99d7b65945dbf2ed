/*
 * NCCL_IB_HCA, as NCCL reads it: a comma list of HCA names, each with an
 * optional ":port"; names match as prefixes ("mlx5" takes mlx5_0 and
 * mlx5_1) unless the list starts with '=' (exact names); a leading '^'
 * (before any '=') turns the list into the HCAs not to use. An entry
 * without a port names every port of its HCAs.
 */
#ifndef BRAID_IB_HCA_H_
#define BRAID_IB_HCA_H_

/* Whether port `port` of HCA `dev` is selected by `spec` (NULL or empty:
 * every port is). */
int ib_hca_match(const char* spec, const char* dev, int port);

/* Whether spec is well formed (names of at most 63 characters, ports
 * 1..255); *why says what is wrong otherwise. */
int ib_hca_valid(const char* spec, const char** why);

#endif /* BRAID_IB_HCA_H_ */
