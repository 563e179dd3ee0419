// DSV4_HOST_DEVICE: functions compiled for the host and, under nvcc or hipcc, for the device too.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DSV4_HOST_DEVICE __host__ __device__
#else
#define DSV4_HOST_DEVICE
#endif
