// Force-included (-include) by .ci/platforms before platform_darwin.cpp is compiled on Linux:
// the macOS-only names it uses, declared as macOS's headers declare them.
#pragma once
#define SO_NOSIGPIPE 0x1022  // <sys/socket.h>
#define TCP_KEEPALIVE 0x10   // <netinet/tcp.h>
struct timespec;
int gethostuuid(unsigned char id[16], const struct timespec* wait);  // <unistd.h>
