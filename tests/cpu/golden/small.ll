; ModuleID = "small"
target triple = "unknown-unknown-unknown"
target datalayout = ""

define void @"small"(ptr %".1", ptr %".2", ptr %".3", i32 %".4")
{
entry:
  %".6" = alloca <4 x float>
  %".7" = alloca <4 x float>
  %".8" = icmp slt i64 0, 3
  br i1 %".8", label %"i.body", label %"i.done"
i.body:
  %"i" = phi  i64 [0, %"entry"], [%".101", %"i.body"]
  store <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, ptr %".6"
  store <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, ptr %".7"
  %".12" = mul nsw i64 %"i", 2
  %".13" = getelementptr inbounds float, ptr %".2", i64 0
  %".14" = load <4 x float>, ptr %".13", align 4
  %".15" = getelementptr inbounds float, ptr %".1", i64 %".12"
  %".16" = load float, ptr %".15", align 4
  %".17" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".16", i32 0
  %".18" = shufflevector <4 x float> %".17", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".19" = load <4 x float>, ptr %".6"
  %".20" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".18", <4 x float> %".14", <4 x float> %".19")
  store <4 x float> %".20", ptr %".6"
  %".22" = add nsw i64 %".12", 1
  %".23" = getelementptr inbounds float, ptr %".1", i64 %".22"
  %".24" = load float, ptr %".23", align 4
  %".25" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".24", i32 0
  %".26" = shufflevector <4 x float> %".25", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".27" = load <4 x float>, ptr %".7"
  %".28" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".26", <4 x float> %".14", <4 x float> %".27")
  store <4 x float> %".28", ptr %".7"
  %".30" = mul nsw i64 %"i", 2
  %".31" = add nsw i64 %".30", 6
  %".32" = getelementptr inbounds float, ptr %".2", i64 4
  %".33" = load <4 x float>, ptr %".32", align 4
  %".34" = getelementptr inbounds float, ptr %".1", i64 %".31"
  %".35" = load float, ptr %".34", align 4
  %".36" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".35", i32 0
  %".37" = shufflevector <4 x float> %".36", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".38" = load <4 x float>, ptr %".6"
  %".39" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".37", <4 x float> %".33", <4 x float> %".38")
  store <4 x float> %".39", ptr %".6"
  %".41" = add nsw i64 %".31", 1
  %".42" = getelementptr inbounds float, ptr %".1", i64 %".41"
  %".43" = load float, ptr %".42", align 4
  %".44" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".43", i32 0
  %".45" = shufflevector <4 x float> %".44", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".46" = load <4 x float>, ptr %".7"
  %".47" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".45", <4 x float> %".33", <4 x float> %".46")
  store <4 x float> %".47", ptr %".7"
  %".49" = mul nsw i64 %"i", 8
  %".50" = load <4 x float>, ptr %".6"
  %".51" = fsub <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, %".50"
  %".52" = call <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".51", <4 x float> <float 0xc055d33340000000, float 0xc055d33340000000, float 0xc055d33340000000, float 0xc055d33340000000>)
  %".53" = call <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".52", <4 x float> <float 0x4056133340000000, float 0x4056133340000000, float 0x4056133340000000, float 0x4056133340000000>)
  %".54" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".53", <4 x float> <float 0x3ff7154760000000, float 0x3ff7154760000000, float 0x3ff7154760000000, float 0x3ff7154760000000>, <4 x float> <float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000>)
  %".55" = call <4 x float> @"llvm.floor.v4f32"(<4 x float> %".54")
  %".56" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".55", <4 x float> <float 0xbfe6300000000000, float 0xbfe6300000000000, float 0xbfe6300000000000, float 0xbfe6300000000000>, <4 x float> %".53")
  %".57" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".55", <4 x float> <float 0x3f2bd01060000000, float 0x3f2bd01060000000, float 0x3f2bd01060000000, float 0x3f2bd01060000000>, <4 x float> %".56")
  %".58" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> <float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000>, <4 x float> %".57", <4 x float> <float 0x3f56e879c0000000, float 0x3f56e879c0000000, float 0x3f56e879c0000000, float 0x3f56e879c0000000>)
  %".59" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".58", <4 x float> %".57", <4 x float> <float 0x3f81112100000000, float 0x3f81112100000000, float 0x3f81112100000000, float 0x3f81112100000000>)
  %".60" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".59", <4 x float> %".57", <4 x float> <float 0x3fa5553820000000, float 0x3fa5553820000000, float 0x3fa5553820000000, float 0x3fa5553820000000>)
  %".61" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".60", <4 x float> %".57", <4 x float> <float 0x3fc5555540000000, float 0x3fc5555540000000, float 0x3fc5555540000000, float 0x3fc5555540000000>)
  %".62" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".61", <4 x float> %".57", <4 x float> <float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000>)
  %".63" = fmul <4 x float> %".57", %".57"
  %".64" = fadd <4 x float> %".57", <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>
  %".65" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".62", <4 x float> %".63", <4 x float> %".64")
  %".66" = fptosi <4 x float> %".55" to <4 x i32>
  %".67" = add <4 x i32> %".66", <i32 127, i32 127, i32 127, i32 127>
  %".68" = shl <4 x i32> %".67", <i32 23, i32 23, i32 23, i32 23>
  %".69" = bitcast <4 x i32> %".68" to <4 x float>
  %".70" = fmul <4 x float> %".65", %".69"
  %".71" = fadd <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".70"
  %".72" = fdiv <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".71"
  %".73" = getelementptr inbounds float, ptr %".3", i64 %".49"
  store <4 x float> %".72", ptr %".73", align 4
  %".75" = load <4 x float>, ptr %".7"
  %".76" = fsub <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, %".75"
  %".77" = call <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".76", <4 x float> <float 0xc055d33340000000, float 0xc055d33340000000, float 0xc055d33340000000, float 0xc055d33340000000>)
  %".78" = call <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".77", <4 x float> <float 0x4056133340000000, float 0x4056133340000000, float 0x4056133340000000, float 0x4056133340000000>)
  %".79" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".78", <4 x float> <float 0x3ff7154760000000, float 0x3ff7154760000000, float 0x3ff7154760000000, float 0x3ff7154760000000>, <4 x float> <float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000>)
  %".80" = call <4 x float> @"llvm.floor.v4f32"(<4 x float> %".79")
  %".81" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".80", <4 x float> <float 0xbfe6300000000000, float 0xbfe6300000000000, float 0xbfe6300000000000, float 0xbfe6300000000000>, <4 x float> %".78")
  %".82" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".80", <4 x float> <float 0x3f2bd01060000000, float 0x3f2bd01060000000, float 0x3f2bd01060000000, float 0x3f2bd01060000000>, <4 x float> %".81")
  %".83" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> <float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000>, <4 x float> %".82", <4 x float> <float 0x3f56e879c0000000, float 0x3f56e879c0000000, float 0x3f56e879c0000000, float 0x3f56e879c0000000>)
  %".84" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".83", <4 x float> %".82", <4 x float> <float 0x3f81112100000000, float 0x3f81112100000000, float 0x3f81112100000000, float 0x3f81112100000000>)
  %".85" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".84", <4 x float> %".82", <4 x float> <float 0x3fa5553820000000, float 0x3fa5553820000000, float 0x3fa5553820000000, float 0x3fa5553820000000>)
  %".86" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".85", <4 x float> %".82", <4 x float> <float 0x3fc5555540000000, float 0x3fc5555540000000, float 0x3fc5555540000000, float 0x3fc5555540000000>)
  %".87" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".86", <4 x float> %".82", <4 x float> <float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000>)
  %".88" = fmul <4 x float> %".82", %".82"
  %".89" = fadd <4 x float> %".82", <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>
  %".90" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".87", <4 x float> %".88", <4 x float> %".89")
  %".91" = fptosi <4 x float> %".80" to <4 x i32>
  %".92" = add <4 x i32> %".91", <i32 127, i32 127, i32 127, i32 127>
  %".93" = shl <4 x i32> %".92", <i32 23, i32 23, i32 23, i32 23>
  %".94" = bitcast <4 x i32> %".93" to <4 x float>
  %".95" = fmul <4 x float> %".90", %".94"
  %".96" = fadd <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".95"
  %".97" = fdiv <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".96"
  %".98" = add nsw i64 %".49", 4
  %".99" = getelementptr inbounds float, ptr %".3", i64 %".98"
  store <4 x float> %".97", ptr %".99", align 4
  %".101" = add nsw nuw i64 %"i", 1
  %".102" = icmp slt i64 %".101", 3
  br i1 %".102", label %"i.body", label %"i.done"
i.done:
  ret void
}

declare <4 x float> @"llvm.fma.v4f32"(<4 x float> %".1", <4 x float> %".2", <4 x float> %".3")

declare <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".1", <4 x float> %".2")

declare <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".1", <4 x float> %".2")

declare <4 x float> @"llvm.floor.v4f32"(<4 x float> %".1")
